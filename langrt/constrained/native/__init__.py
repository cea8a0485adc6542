"""Native helpers of the grammar engine (plain C++, any CPU, built on first use by build.py):
token_walk.py (token masks) and regex_dfa.py (regex automata)."""
