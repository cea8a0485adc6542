"""Every --dtype starts and answers on this CPU, with the C++ kernels and without them.

CI runs this file twice: as this machine is (AVX-512), and as an AVX2-only CPU is
(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2, see .ci/run), where the kernels' AVX2 build
runs and oneDNN has no bf16 path. Each Engine's log names the path it took, once.
"""

from __future__ import annotations

import pytest

import langrt
from langrt_kernels.cpu import isa
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
    kernels_used = isa() is not None and kernels == "on" and dtype != "float16"
    assert (f": C++ kernels on ({isa()})" in path_lines[0]) == kernels_used, path_lines[0]


COMPILE_BOTH_HALVES = """
import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir
from langrt.model.llama import DenseOps

cache_dir()  # inductor used before langrt's compile: it has put its default in the environment

ops = DenseOps.create(compiled=True)
hidden, heads, head_dim, inter = 64, 4, 16, 128
w = lambda *shape: torch.randn(*shape) * 0.1
for rows in (1, 7, 33):
    x, cos, sin = w(rows, hidden), w(rows, 1, head_dim // 2), w(rows, 1, head_dim // 2)
    q, k, v, residual = ops.before_attention(
        x, None, w(hidden), 1e-5, w(3 * hidden, hidden), None, None, cos, sin, hidden, hidden, head_dim)
    out, residual = ops.after_attention(
        v, residual, w(hidden, hidden), None, w(hidden), 1e-5, w(2 * inter, hidden), None, w(hidden, inter), None)
    assert out.shape == (rows, hidden)
print("compiled", torch.backends.cpu.get_cpu_capability())
"""


def test_torch_compile_on_the_avx2_path_then_the_native_one(tmp_path):
    """torch.compile's cache is not keyed on ATEN_CPU_CAPABILITY: a kernel cached on the AVX2
    path once aborted the next compiled run on the AVX-512 one (the CI run of the AVX2 pass
    followed by the plain suite). Each path must keep its own cache."""
    import os
    import subprocess
    import sys

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    }
    env["TMPDIR"] = str(tmp_path)  # inductor's default cache lives under the temp directory
    avx2 = {**env, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    for run_env in (avx2, env, avx2):
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_BOTH_HALVES], env=run_env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "compiled" in done.stdout
