"""`python -m langrt_kernels.cpu`: load the CPU kernels now (the package's prebuilt libraries, or
built where there are none: scripts/install.sh runs it), then say which library each is."""

import logging

from langrt_kernels.cpu import build_cache, isa, library_spec, paged_attention, quant

logging.basicConfig(level=logging.INFO, format="%(message)s")
if paged_attention() is not None:
    print(f"CPU kernels: ready ({isa()}): {build_cache.status(library_spec(isa()))}")
else:
    print("CPU kernels: not used (see the warning above)")
if quant.available():
    print(f"quantized CPU kernels: ready ({quant.isa()}): {build_cache.status(quant.library_spec())}")
else:
    print("quantized CPU kernels: not used (see the warning above)")
