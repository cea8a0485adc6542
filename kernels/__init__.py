"""langrt's kernels: Triton kernels, each with a validated launcher and a torch reference, and the
C++ CPU kernels in `cpu/`.

This folder installs as `langrt_kernels`, so PyPI's unrelated top-level `kernels` package (which
transformers imports for some models) can live in the same environment.
"""
