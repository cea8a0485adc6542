"""Native helpers of the grammar engine (plain C++, any CPU): token_walk.py."""
