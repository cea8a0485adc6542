"""Tokenizers: loading one from an HF directory or a GGUF file (`loader`), decode-only text
without transformers (`text_decoder`), and incremental detokenization (`incremental_decoder`).

Importing this package imports neither torch nor transformers.
"""
