"""`python -m langrt_kernels.cpu`: build (or load) the CPU kernels now; scripts/install.sh runs it."""

import logging

from langrt_kernels.cpu import isa, paged_attention, quant

logging.basicConfig(level=logging.INFO, format="%(message)s")
print("CPU kernels:", f"ready ({isa()})" if paged_attention() is not None else "not used (see the warning above)")
print("quantized CPU kernels:", f"ready ({quant.isa()})" if quant.available() else "not used (see the warning above)")
