"""The detokenizer process: token ids in, incremental text out."""
