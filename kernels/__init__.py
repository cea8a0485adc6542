"""langrt's Triton kernels, each with a validated launcher and a torch reference.

PyPI has an unrelated distribution that also installs a top-level `kernels` module. langrt code
imports this package through `langrt.kernels_package()`, which checks the marker below and
fails with a clear message rather than silently using the other one.
"""

LANGRT_KERNELS = True
