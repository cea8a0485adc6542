"""`python -m kernels.cpu`: build (or load) the CPU kernels now; scripts/install.sh runs it."""

import logging

from kernels.cpu import paged_attention

logging.basicConfig(level=logging.INFO, format="%(message)s")
print("CPU kernels:", "ready" if paged_attention() is not None else "not used (see the warning above)")
