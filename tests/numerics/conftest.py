"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest

from langrt_kernels.cpu import ISA_ENV, available_isas, reset


@pytest.fixture(scope="module", params=available_isas() or ["none"])
def cpu_isa(request):
    """Each build of the C++ layer kernels this CPU runs, in turn (avx512, avx2), chosen through
    LANGRT_CPU_ISA; what langrt.model.layers loads follows it."""
    from langrt.model import layers

    def forget():
        reset()
        layers._load_cpu_kernels.cache_clear()

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ISA_ENV, request.param)
        forget()
        yield request.param
    forget()
