"""`python -m kernels.cpu`: build (or load) the CPU attention kernel now; scripts/install.sh runs it."""

import logging

from kernels.cpu import paged_attention

logging.basicConfig(level=logging.INFO, format="%(message)s")
print("CPU attention kernel:", "ready" if paged_attention() is not None else "not used (see the warning above)")
