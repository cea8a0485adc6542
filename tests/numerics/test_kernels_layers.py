"""RMSNorm (+ residual), rotary and SiLU-and-mul: references, Triton kernels, langrt's C++ CPU
kernels, and the model's torch ops.

The references are checked against `langrt.model.layers` with its torch ops (the path the model
runs where no fused kernel applies), so a kernel that matches its reference follows the model's
conventions (rotate-half layout, where the 16-bit roundings fall). The Triton launchers run in
Triton's interpreter on CPU tensors, in a subprocess started with TRITON_INTERPRET=1: this file
run as a script. The C++ kernels (kernels/cpu, what `layers` runs on CPU) are checked against the
same references.

The interpreter rounds float32 -> bfloat16 toward zero (the GPU rounds to nearest even), so
bfloat16 cases compare with a tolerance of two bfloat16 ulps; float32 and float16 (numpy's own
rounding) compare tightly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from langrt_kernels.cpu import unavailable_reason
from langrt.model import layers

REPO = Path(__file__).resolve().parents[2]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
KERNEL_TOLERANCE = {
    "float32": dict(atol=1e-5, rtol=1e-5),
    "float16": dict(atol=2e-3, rtol=2e-3),
    "bfloat16": dict(atol=2e-2, rtol=1.6e-2),
}


# --- cases shared with the interpreter subprocess -----------------------------------------------

NORM_CASES = [
    dict(
        id=f"h{hidden}-{dtype}-{'residual' if residual else 'plain'}{'-strided' if pad else ''}",
        hidden=hidden,
        dtype=dtype,
        residual=residual,
        pad=pad,
    )
    for hidden, pad in ((64, 0), (96, 5), (2048, 0))
    for dtype in DTYPES
    for residual in (False, True)
]
ROTARY_CASES = [
    dict(id=f"d{dim}-q{hq}-k{hk}-{dtype}", dim=dim, q_heads=hq, k_heads=hk, dtype=dtype)
    for dim in (64, 128)
    for hq, hk in ((4, 4), (8, 2), (8, 1))
    for dtype in DTYPES
]
SILU_CASES = [dict(id=f"i{width}-{dtype}", width=width, dtype=dtype) for width in (128, 300, 5000) for dtype in DTYPES]


def norm_tensors(case: dict):
    gen = torch.Generator().manual_seed(case["hidden"])
    dtype, hidden = DTYPES[case["dtype"]], case["hidden"]
    wide = (3 * torch.randn(5, hidden + case["pad"], generator=gen)).to(dtype)
    x = wide[:, :hidden]  # rows strided when padded
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    residual = torch.randn(5, hidden, generator=gen).to(dtype) if case["residual"] else None
    return x, weight, residual


def rotary_tensors(case: dict):
    """A fused qkv [T, (Hq + 2 Hk) D] and the model's cos, sin for random positions."""
    dim, hq, hk, dtype = case["dim"], case["q_heads"], case["k_heads"], DTYPES[case["dtype"]]
    gen = torch.Generator().manual_seed(dim + hq)
    positions = torch.tensor([0, 1, 7, 300, 2047])
    qkv = torch.randn(len(positions), (hq + 2 * hk) * dim, generator=gen).to(dtype)
    rope = layers.RotaryEmbedding(dim, 2048, 500000.0, None)
    cos, sin = rope.cos_sin(positions, dtype)  # [T, 1, D/2]
    return qkv, cos[:, 0], sin[:, 0]


def rotary_views(qkv: torch.Tensor, case: dict):
    """q and k as [T, H, D] views into qkv (token stride = the fused width)."""
    dim, hq, hk = case["dim"], case["q_heads"], case["k_heads"]
    t = qkv.shape[0]
    return qkv[:, : hq * dim].view(t, hq, dim), qkv[:, hq * dim : (hq + hk) * dim].view(t, hk, dim)


def silu_tensors(case: dict):
    gen = torch.Generator().manual_seed(case["width"])
    wide = (4 * torch.randn(3, 2 * case["width"] + 3, generator=gen)).to(DTYPES[case["dtype"]])
    return wide[:, : 2 * case["width"]]  # rows strided


# --- the references against the model's torch ops ----------------------------------------------


@pytest.fixture
def torch_ops_only(monkeypatch):
    """`layers` with no fused kernels: the torch ops."""
    monkeypatch.setattr(layers, "_fused_kernels", lambda x: None)


@pytest.mark.usefixtures("torch_ops_only")
@pytest.mark.parametrize("case", NORM_CASES, ids=[c["id"] for c in NORM_CASES])
def test_rms_norm_reference_is_the_models_norm(case):
    from langrt_kernels.rms_norm import rms_norm_reference

    x, weight, residual = norm_tensors(case)
    module = layers.RMSNorm(case["hidden"], 1e-5).to(weight.dtype)
    module.weight.data.copy_(weight)
    if residual is None:
        assert torch.equal(rms_norm_reference(x, weight, 1e-5), layers.rms_norm(x, weight, 1e-5))
    else:
        out, summed = rms_norm_reference(x, weight, 1e-5, residual)
        expected_out, expected_sum = module(x, residual)
        assert torch.equal(summed, expected_sum)
        torch.testing.assert_close(out, expected_out, atol=0, rtol=1e-6 if case["dtype"] == "float32" else 0)


@pytest.mark.usefixtures("torch_ops_only")
@pytest.mark.parametrize("case", ROTARY_CASES, ids=[c["id"] for c in ROTARY_CASES])
def test_rotary_reference_is_the_models_rotary(case):
    from langrt_kernels.rotary import rotary_embedding_reference

    qkv, cos, sin = rotary_tensors(case)
    width = (case["q_heads"] + case["k_heads"]) * case["dim"]
    expected = layers.apply_rotary(qkv[:, :width], cos[:, None], sin[:, None], case["dim"])
    rotated = qkv.clone()
    rotary_embedding_reference(*rotary_views(rotated, case), cos, sin)
    assert torch.equal(rotated[:, :width], expected)
    assert torch.equal(rotated[:, width:], qkv[:, width:])  # v untouched
    assert not torch.equal(rotated[1:, :width], qkv[1:, :width])  # position 0 is the identity


@pytest.mark.usefixtures("torch_ops_only")
@pytest.mark.parametrize("case", SILU_CASES, ids=[c["id"] for c in SILU_CASES])
def test_silu_and_mul_reference_is_the_models_activation(case):
    from langrt_kernels.silu_and_mul import silu_and_mul_reference

    gate_up = silu_tensors(case)
    assert torch.equal(silu_and_mul_reference(gate_up), layers.silu_and_mul(gate_up))


# --- the C++ CPU kernels (what `layers` runs on CPU) against the references -----------------------

needs_cpu_kernels = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"C++ CPU kernels unavailable: {unavailable_reason()}"
)
CPU_DTYPES = ("float32", "bfloat16")  # what they take; float16 keeps the torch ops


def _one_ulp(dtype: torch.dtype, want: torch.Tensor) -> torch.Tensor:
    """Per element: one ulp of `want` in dtype (float32 or bfloat16)."""
    mantissa = 23 if dtype == torch.float32 else 7
    return torch.ldexp(torch.ones_like(want, dtype=torch.float32), torch.frexp(want.float()).exponent - 1 - mantissa)


@needs_cpu_kernels
@pytest.mark.usefixtures("cpu_isa")
@pytest.mark.parametrize("case", [c for c in NORM_CASES if c["dtype"] in CPU_DTYPES], ids=lambda c: c["id"])
def test_cpu_rms_norm_kernel_is_the_reference_to_one_ulp(case):
    from langrt_kernels.cpu import layer_ops
    from langrt_kernels.rms_norm import rms_norm_reference

    x, weight, residual = norm_tensors(case)
    dtype = DTYPES[case["dtype"]]
    assert layers._fused_kernels(x) is not None  # what the model runs here
    if residual is None:
        got, want = layer_ops().rms_norm(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5)
        assert torch.equal(layers.rms_norm(x, weight, 1e-5), got)
    else:
        (got, got_sum), (want, want_sum) = (
            layer_ops().rms_norm(x, weight, 1e-5, residual),
            rms_norm_reference(x, weight, 1e-5, residual),
        )
        assert torch.equal(got_sum, want_sum)  # the sum is rounded exactly as torch rounds it
        module = layers.RMSNorm(case["hidden"], 1e-5).to(dtype)
        module.weight.data.copy_(weight)
        module_out, module_sum = module(x, residual)
        assert torch.equal(module_out, got) and torch.equal(module_sum, got_sum)
    # the scale's float32 arithmetic may differ from torch's in the last bit (the order of the sum
    # of squares), carried through two products: a few float32 ulps, at most one bfloat16 ulp
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=0, rtol=1e-6)
    else:
        assert ((got.float() - want.float()).abs() <= _one_ulp(dtype, want)).all()
    assert (got == want).float().mean() > 0.4


@needs_cpu_kernels
@pytest.mark.usefixtures("cpu_isa")
@pytest.mark.parametrize("case", [c for c in ROTARY_CASES if c["dtype"] in CPU_DTYPES], ids=lambda c: c["id"])
def test_cpu_rotary_kernel_is_the_reference_bit_for_bit(case):
    from langrt_kernels.cpu import layer_ops
    from langrt_kernels.rotary import rotary_embedding_reference

    qkv, cos, sin = rotary_tensors(case)
    want, got = qkv.clone(), qkv.clone()
    rotary_embedding_reference(*rotary_views(want, case), cos, sin)
    width = (case["q_heads"] + case["k_heads"]) * case["dim"]
    t = qkv.shape[0]
    layer_ops().rotary(got[:, :width].view(t, -1, case["dim"]), None, cos, sin)  # q and k as one view, in place
    assert torch.equal(got, want)
    model = layers.apply_rotary(qkv[:, :width].clone(), cos[:, None], sin[:, None], case["dim"])
    assert torch.equal(model, want[:, :width])


@needs_cpu_kernels
@pytest.mark.usefixtures("cpu_isa")
@pytest.mark.parametrize(
    "case", [c for c in SILU_CASES if c["dtype"] in CPU_DTYPES and c["width"] % 16 == 0], ids=lambda c: c["id"]
)
def test_cpu_silu_and_mul_kernel_is_the_reference_to_one_ulp(case):
    from langrt_kernels.cpu import layer_ops
    from langrt_kernels.silu_and_mul import silu_and_mul_reference

    gate_up = silu_tensors(case)
    dtype = DTYPES[case["dtype"]]
    got, want = layer_ops().silu_and_mul(gate_up), silu_and_mul_reference(gate_up)
    assert torch.equal(layers.silu_and_mul(gate_up), got)
    # exp by langrt's polynomial (about one float32 ulp), then a division and a product: a few
    # float32 ulps; in bfloat16 the SiLU's rounding can then move the product by one ulp
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-30, rtol=1e-6)
    else:
        assert ((got.float() - want.float()).abs() <= _one_ulp(dtype, want)).all()
    assert (got == want).float().mean() > 0.9


@needs_cpu_kernels
@pytest.mark.usefixtures("cpu_isa")
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_cpu_kernels_give_each_row_the_same_bits_alone_or_batched(dtype):
    """What keeps jump-forward's larger passes from changing a row's numbers."""
    from langrt_kernels.cpu import layer_ops

    ops, dt = layer_ops(), DTYPES[dtype]
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(40, 576, generator=gen).to(dt) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(576, generator=gen)).to(dt)
    gate_up = torch.randn(40, 3072, generator=gen).to(dt)
    heads = torch.randn(40, 15, 64, generator=gen).to(dt)
    cos, sin = torch.randn(40, 32, generator=gen).to(dt), torch.randn(40, 32, generator=gen).to(dt)
    normed, summed = ops.rms_norm(x, weight, 1e-5, residual)
    act = ops.silu_and_mul(gate_up)
    rotated = heads.clone()
    ops.rotary(rotated, None, cos, sin)
    for i in (0, 17, 39):
        one = slice(i, i + 1)
        alone, alone_sum = ops.rms_norm(x[one], weight, 1e-5, residual[one])
        assert torch.equal(alone, normed[one]) and torch.equal(alone_sum, summed[one])
        assert torch.equal(ops.silu_and_mul(gate_up[one]), act[one])
        row = heads[one].clone()
        ops.rotary(row, None, cos[one], sin[one])
        assert torch.equal(row, rotated[one])


@needs_cpu_kernels
@pytest.mark.usefixtures("cpu_isa")
def test_cpu_kernels_refuse_what_they_cannot_take():
    from langrt_kernels.cpu import torch_ops

    ops = torch_ops()
    x, w = torch.zeros(2, 64), torch.ones(64)
    with pytest.raises(RuntimeError, match="hidden size must be a multiple of 16"):
        ops.rms_norm(torch.zeros(2, 40), torch.ones(40), 1e-6, None, torch.zeros(2, 40), None)
    with pytest.raises(RuntimeError, match="weight must be contiguous"):
        ops.rms_norm(x, w.bfloat16(), 1e-6, None, torch.zeros(2, 64), None)
    with pytest.raises(RuntimeError, match="residual and summed go together"):
        ops.rms_norm(x, w, 1e-6, x, torch.zeros(2, 64), None)
    with pytest.raises(RuntimeError, match="head_dim must be a multiple of 32"):
        ops.rotary(torch.zeros(3, 2, 16), torch.zeros(3, 8), torch.zeros(3, 8))
    with pytest.raises(RuntimeError, match="cos and sin must be"):
        ops.rotary(torch.zeros(3, 2, 64), torch.zeros(2, 32), torch.zeros(3, 32))
    with pytest.raises(RuntimeError, match="bfloat16 or float32 only"):
        ops.silu_and_mul(torch.zeros(3, 64).half(), torch.zeros(3, 32).half())
    with pytest.raises(RuntimeError, match=r"gate_up \[T, 2I\]"):
        ops.silu_and_mul(torch.zeros(3, 64), torch.zeros(3, 16))


def test_cpu_layers_never_import_triton():
    code = (
        "import sys, torch\n"
        "from langrt.model import layers\n"
        "x = torch.randn(3, 64)\n"
        "layers.rms_norm(x, torch.ones(64), 1e-6)\n"
        "layers.RMSNorm(64, 1e-6)(x, x)\n"
        "layers.silu_and_mul(x)\n"
        "layers.apply_rotary(x, torch.ones(3, 1, 8), torch.zeros(3, 1, 8), 16)\n"
        "triton_kernels = [m for m in sys.modules if m.startswith('langrt_kernels.') and m.split('.')[1] != 'cpu']\n"
        "assert not any(m == 'triton' or m.startswith('triton.') for m in sys.modules) and not triton_kernels, sorted(sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr


# --- argument errors ------------------------------------------------------------------------------


def _bad_calls():
    x, w = torch.zeros(2, 64), torch.ones(64)
    q, k, cs = torch.zeros(3, 4, 16), torch.zeros(3, 2, 16), torch.zeros(3, 8)
    return [
        (
            "rms_norm",
            (x.long(), w, 1e-6),
            TypeError,
            "x must be a float32, float16 or bfloat16 tensor, got torch.int64",
        ),
        ("rms_norm", (x[0], w, 1e-6), ValueError, r"x must be 2-D \[tokens, hidden\], got shape \(64,\)"),
        ("rms_norm", (x, w[:32], 1e-6), ValueError, "weight has 32 entries but x rows have 64"),
        ("rms_norm", (x, w.half(), 1e-6), TypeError, "weight is torch.float16 but x is torch.float32"),
        ("rms_norm", (x, w, 1e-6, x[:1]), ValueError, r"residual \(1, 64\) must have x's shape \(2, 64\)"),
        ("rms_norm", (torch.zeros(2, 128)[:, ::2], w, 1e-6), ValueError, r"x must be contiguous in its last dimension"),
        (
            "rotary_embedding",
            (q, k, cs, cs[:2]),
            ValueError,
            r"sin must be \[tokens, head_dim / 2\] = \(3, 8\), got \(2, 8\)",
        ),
        ("rotary_embedding", (q, k[:, :, :8], cs, cs), ValueError, r"k \(3, 2, 8\) must have q's tokens and head_dim"),
        ("rotary_embedding", (q, k, cs.double(), cs), TypeError, "cos must be a float32, float16 or bfloat16 tensor"),
        ("rotary_embedding", (q, k.half(), cs, cs), TypeError, "k is torch.float16 but q is torch.float32"),
        ("rotary_embedding", (torch.zeros(3, 4, 15), None, cs, cs), ValueError, "head_dim must be even"),
        ("silu_and_mul", (torch.zeros(3, 7),), ValueError, "gate_up's width 7 must be even"),
        ("silu_and_mul", (torch.zeros(3, 2, 8),), ValueError, r"gate_up must be 2-D \[tokens, 2 \* intermediate\]"),
    ]


BAD_CALLS = _bad_calls()


@pytest.mark.parametrize("flavour", ["triton", "reference"])
@pytest.mark.parametrize("bad", BAD_CALLS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_CALLS)])
def test_bad_arguments_are_refused_with_a_reason(flavour, bad):
    import importlib

    name, args, error, message = bad
    module = importlib.import_module(f"langrt_kernels.{name.removesuffix('_embedding')}")
    with pytest.raises(error, match=message):
        getattr(module, f"{name}_{flavour}")(*args)


def test_launchers_refuse_cpu_tensors_outside_the_interpreter():
    from langrt_kernels.rms_norm import rms_norm_triton
    from langrt_kernels.rotary import rotary_embedding_triton
    from langrt_kernels.silu_and_mul import silu_and_mul_triton

    with pytest.raises(
        ValueError, match="rms_norm_triton needs CUDA tensors, got cpu; use langrt.model.layers.rms_norm"
    ):
        rms_norm_triton(torch.zeros(2, 64), torch.ones(64), 1e-6)
    with pytest.raises(ValueError, match="rotary_embedding_triton needs CUDA tensors"):
        rotary_embedding_triton(torch.zeros(3, 4, 16), None, torch.zeros(3, 8), torch.zeros(3, 8))
    with pytest.raises(ValueError, match="silu_and_mul_triton needs CUDA tensors"):
        silu_and_mul_triton(torch.zeros(3, 8))


# --- the kernels in the interpreter (subprocess) ------------------------------------------------


@pytest.fixture(scope="module")
def interpreter_results():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, __file__, "--interpreter-worker"]
    result = subprocess.run(command, check=False, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    if result.returncode != 0 or not result.stdout.strip():
        pytest.fail(f"the Triton interpreter worker failed (rc={result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_interpreter_worker_ran_the_interpreter(interpreter_results):
    assert interpreter_results["interpreted"] is True


@pytest.mark.parametrize("case_id", [c["id"] for c in NORM_CASES])
def test_rms_norm_kernel_matches_reference(interpreter_results, case_id):
    assert interpreter_results["rms_norm"][case_id] == "ok"


@pytest.mark.parametrize("case_id", [c["id"] for c in ROTARY_CASES])
def test_rotary_kernel_matches_reference_in_place(interpreter_results, case_id):
    assert interpreter_results["rotary"][case_id] == "ok"


@pytest.mark.parametrize("case_id", [c["id"] for c in SILU_CASES])
def test_silu_and_mul_kernel_matches_reference(interpreter_results, case_id):
    assert interpreter_results["silu_and_mul"][case_id] == "ok"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
@pytest.mark.parametrize("case", NORM_CASES, ids=[c["id"] for c in NORM_CASES])
def test_rms_norm_kernel_on_cuda_is_the_models_norm(case):
    from langrt_kernels.rms_norm import rms_norm_reference

    x, weight, residual = (None if t is None else t.cuda() for t in norm_tensors(case))
    module = layers.RMSNorm(case["hidden"], 1e-5).to(device="cuda", dtype=weight.dtype)
    module.weight.data.copy_(weight)
    # On CUDA the model's own functions dispatch to the kernel.
    got = layers.rms_norm(x, weight, 1e-5) if residual is None else torch.cat(module(x, residual))
    expected = rms_norm_reference(x, weight, 1e-5, residual)
    expected = expected if residual is None else torch.cat(expected)
    assert _compare(got, expected, case["dtype"]) == "ok"


@needs_cuda
@pytest.mark.parametrize("case", ROTARY_CASES, ids=[c["id"] for c in ROTARY_CASES])
def test_rotary_kernel_on_cuda_is_the_models_rotary(case):
    from langrt_kernels.rotary import rotary_embedding_reference

    qkv, cos, sin = (t.cuda() for t in rotary_tensors(case))
    width = (case["q_heads"] + case["k_heads"]) * case["dim"]
    expected = qkv.clone()
    rotary_embedding_reference(*rotary_views(expected, case), cos, sin)
    got = layers.apply_rotary(qkv[:, :width], cos[:, None], sin[:, None], case["dim"])  # the kernel, in place
    assert _compare(got, expected[:, :width], case["dtype"]) == "ok"


@needs_cuda
@pytest.mark.parametrize("case", SILU_CASES, ids=[c["id"] for c in SILU_CASES])
def test_silu_and_mul_kernel_on_cuda_is_the_models_activation(case):
    from langrt_kernels.silu_and_mul import silu_and_mul_reference

    gate_up = silu_tensors(case).cuda()
    assert _compare(layers.silu_and_mul(gate_up), silu_and_mul_reference(gate_up), case["dtype"]) == "ok"


def _compare(out: torch.Tensor, expected: torch.Tensor, dtype: str) -> str:
    try:
        torch.testing.assert_close(out.float(), expected.float(), **KERNEL_TOLERANCE[dtype])
    except AssertionError as error:
        return str(error)[:500]
    return "ok"


def _guarded(run) -> str:
    try:
        return run()
    except Exception as error:  # noqa: BLE001 - reported to the parent test, which fails on it
        return f"raised {type(error).__name__}: {error}"


def _norm_case(case: dict) -> str:
    from langrt_kernels.rms_norm import rms_norm_reference, rms_norm_triton

    x, weight, residual = norm_tensors(case)
    if residual is None:
        return _compare(rms_norm_triton(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5), case["dtype"])
    (out, summed), (expected_out, expected_sum) = (
        rms_norm_triton(x, weight, 1e-5, residual),
        rms_norm_reference(x, weight, 1e-5, residual),
    )
    return _compare(torch.cat([out, summed]), torch.cat([expected_out, expected_sum]), case["dtype"])


def _rotary_case(case: dict) -> str:
    from langrt_kernels.rotary import rotary_embedding_reference, rotary_embedding_triton

    qkv, cos, sin = rotary_tensors(case)
    expected, got = qkv.clone(), qkv.clone()
    rotary_embedding_reference(*rotary_views(expected, case), cos, sin)
    rotary_embedding_triton(*rotary_views(got, case), cos, sin)
    width = (case["q_heads"] + case["k_heads"]) * case["dim"]
    if not torch.equal(got[:, width:], qkv[:, width:]):
        return "the kernel wrote into v"
    return _compare(got, expected, case["dtype"])


def _silu_case(case: dict) -> str:
    from langrt_kernels.silu_and_mul import silu_and_mul_reference, silu_and_mul_triton

    gate_up = silu_tensors(case)
    return _compare(silu_and_mul_triton(gate_up), silu_and_mul_reference(gate_up), case["dtype"])


def _interpreter_worker() -> dict:
    os.environ["TRITON_INTERPRET"] = "1"  # before kernels (and so triton) is imported
    import langrt_kernels.rms_norm as rms

    return {
        "interpreted": rms.is_interpreted(),
        "rms_norm": {c["id"]: _guarded(lambda c=c: _norm_case(c)) for c in NORM_CASES},
        "rotary": {c["id"]: _guarded(lambda c=c: _rotary_case(c)) for c in ROTARY_CASES},
        "silu_and_mul": {c["id"]: _guarded(lambda c=c: _silu_case(c)) for c in SILU_CASES},
    }


if __name__ == "__main__" and sys.argv[1:] == ["--interpreter-worker"]:
    torch.set_num_threads(1)
    print(json.dumps(_interpreter_worker()))
