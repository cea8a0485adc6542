"""Every --dtype starts and answers on this CPU, with the C++ kernels and without them.

CI runs this file twice: as this machine is (AVX-512), and as an AVX2-only CPU is
(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2, see .ci/run), where the kernels are off and
oneDNN has no bf16 path. Each Engine's log names the path it took, once.
"""

from __future__ import annotations

import pytest

import langrt
from langrt.cpu_features import avx512_unavailable_reason, fast_bf16

pytestmark = pytest.mark.slow

DTYPES = ["auto", "float32", "bfloat16", "float16"]


@pytest.mark.parametrize("kernels", ["on", "off"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_engine_answers_in_every_dtype(dtype, kernels, monkeypatch, capfd):
    if kernels == "off":
        monkeypatch.setenv("LANGRT_CPU_KERNELS", "0")
    else:
        monkeypatch.delenv("LANGRT_CPU_KERNELS", raising=False)
    with langrt.Engine(dtype=dtype, log_level="info", max_total_tokens=4096) as engine:
        out = engine.generate("The capital of France is", {"max_new_tokens": 4, "temperature": 0})
        served = engine.args.dtype
    assert "Paris" in out["text"]
    assert served == (("bfloat16" if fast_bf16() else "float32") if dtype == "auto" else dtype)
    log = capfd.readouterr().err
    path_lines = [line for line in log.splitlines() if "] CPU path: " in line]
    assert len(path_lines) == 1, log[-3000:]
    avx512 = avx512_unavailable_reason() is None
    assert path_lines[0].split("] ", 1)[1].startswith("CPU path: AVX-512" if avx512 else "CPU path: AVX2 (")
    kernels_used = avx512 and kernels == "on" and dtype != "float16"
    assert (": C++ kernels on" in path_lines[0]) == kernels_used, path_lines[0]
