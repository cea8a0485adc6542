"""Embeddings: pooling of a model's hidden states into one vector per input (encoder models such
as BERT, and decoder models served with --is-embedding)."""
