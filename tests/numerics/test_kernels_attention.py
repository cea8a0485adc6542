"""Decode and extend attention over the paged pool: references, Triton kernels, the triton backend.

The torch references are checked against SDPA on K/V gathered by hand. The Triton launchers run
in Triton's interpreter on CPU tensors, in a subprocess started with TRITON_INTERPRET=1 (so the
variable never leaks into this process or other tests); that subprocess is this file run as a
script: it runs every kernel case, and a tiny Llama through ModelRunner with
attention_backend="triton" and "torch", and reports back as JSON.

Interpreter limits worked around (see kernels/*_attention.py): its tl.dot multiplies bfloat16
tiles as raw bits, so the launchers give tl.dot float32 tiles there; and it rounds float32 ->
bfloat16 toward zero (the GPU rounds to nearest), so bfloat16 cases compare with a tolerance
of a few bfloat16 ulps rather than exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TOLERANCE = {"float32": dict(atol=2e-5, rtol=2e-5), "bfloat16": dict(atol=3e-2, rtol=2e-2)}


# --- cases shared with the interpreter subprocess -----------------------------------------------


def _heads(ratio: int) -> tuple[int, int]:
    """(query heads, KV heads) for a GQA ratio, kept small for the interpreter."""
    kv_heads = 1 if ratio == 8 else 2
    return kv_heads * ratio, kv_heads


def _decode_cases() -> list[dict]:
    cases = []
    for dim in (64, 128):
        for ratio in (1, 4, 8):
            for dtype in DTYPES:
                for splits in (1, 3):  # 3: ranges shorter than a tile, and empty ones for length 1
                    cases.append(
                        dict(dim=dim, ratio=ratio, dtype=dtype, seq_lens=[1, 19, 40], splits=splits, window=None)
                    )
    cases += [
        dict(dim=64, ratio=4, dtype="float32", seq_lens=[3, 30, 47], splits=2, window=10),
        dict(dim=64, ratio=4, dtype="bfloat16", seq_lens=[3, 30, 47], splits=2, window=10),
        dict(dim=128, ratio=8, dtype="float32", seq_lens=[130], splits=4, window=None),  # long: tiles within ranges
        dict(dim=64, ratio=1, dtype="float32", seq_lens=[5, 70], splits=None, window=None),  # the default split count
        dict(dim=80, ratio=4, dtype="float32", seq_lens=[9, 33], splits=2, window=None),  # head dim not a power of 2
    ]
    for case in cases:
        window = "" if case["window"] is None else f"-w{case['window']}"
        case["id"] = (
            f"d{case['dim']}-gqa{case['ratio']}-{case['dtype']}-lens{max(case['seq_lens'])}-splits{case['splits']}{window}"
        )
    return cases


def _extend_cases() -> list[dict]:
    cases = []
    for dim in (64, 128):
        for ratio in (1, 4, 8):
            for dtype in DTYPES:
                # Ragged: no prefix; a prefix and one new token; a prefix and two query tiles.
                cases.append(dict(dim=dim, ratio=ratio, dtype=dtype, prefix=[0, 6, 21], extend=[9, 1, 19], window=None))
    cases += [
        dict(dim=64, ratio=4, dtype="float32", prefix=[0, 12, 30], extend=[20, 3, 18], window=7),
        dict(dim=64, ratio=4, dtype="bfloat16", prefix=[0, 12, 30], extend=[20, 3, 18], window=7),
        dict(dim=64, ratio=1, dtype="float32", prefix=[0], extend=[35], window=None),  # plain causal prefill
        dict(dim=80, ratio=4, dtype="float32", prefix=[4, 0], extend=[17, 5], window=None),
    ]
    for case in cases:
        window = "" if case["window"] is None else f"-w{case['window']}"
        case["id"] = f"d{case['dim']}-gqa{case['ratio']}-{case['dtype']}-prefix{max(case['prefix'])}{window}"
    return cases


DECODE_CASES = _decode_cases()
EXTEND_CASES = _extend_cases()


def make_pool(case: dict, seq_lens: list[int], new_tokens: int, seed: int) -> dict:
    """Random K/V buffers, a shuffled req_to_token, and q for `new_tokens` tokens as a column
    slice of a wider buffer (row-strided, like q taken out of a fused qkv projection)."""
    heads, kv_heads = _heads(case["ratio"])
    dim, dtype = case["dim"], DTYPES[case["dtype"]]
    gen = torch.Generator().manual_seed(seed)
    rows, context = len(seq_lens) + 2, max(seq_lens) + 5
    slots = rows * context
    wide = torch.randn(new_tokens, heads + kv_heads, dim, generator=gen).to(dtype)
    return dict(
        q=wide[:, :heads],
        k_buffer=torch.randn(slots, kv_heads, dim, generator=gen).to(dtype),
        v_buffer=torch.randn(slots, kv_heads, dim, generator=gen).to(dtype),
        req_to_token=torch.randperm(slots, generator=gen).to(torch.int32).view(rows, context),
        req_pool_indices=torch.randperm(rows, generator=gen)[: len(seq_lens)],
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
    )


def decode_args(case: dict) -> dict:
    return make_pool(case, case["seq_lens"], len(case["seq_lens"]), seed=len(case["id"]))


def extend_args(case: dict) -> tuple[dict, int]:
    seq_lens = [p + e for p, e in zip(case["prefix"], case["extend"])]
    args = make_pool(case, seq_lens, sum(case["extend"]), seed=len(case["id"]))
    args["qo_indptr"] = torch.tensor([0, *torch.tensor(case["extend"]).cumsum(0).tolist()], dtype=torch.int64)
    return args, max(case["extend"])


# --- the references against SDPA on gathered K/V ------------------------------------------------


def _sdpa_one(q, k_buffer, v_buffer, slots, q_pos, window):
    """q [E, H, D] at positions q_pos over the keys in `slots` (positions 0..S-1), via SDPA."""
    k = k_buffer[slots].float().transpose(0, 1)  # [Hkv, S, D]
    v = v_buffer[slots].float().transpose(0, 1)
    k_pos = torch.arange(len(slots))[None, :]
    mask = k_pos <= q_pos[:, None]
    if window:
        mask &= k_pos > q_pos[:, None] - window
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1), k, v, attn_mask=mask, enable_gqa=True)
    return out.transpose(0, 1)


@pytest.mark.parametrize("case", DECODE_CASES, ids=[c["id"] for c in DECODE_CASES])
def test_decode_reference_matches_sdpa(case):
    from langrt_kernels.decode_attention import decode_attention_reference

    a = decode_args(case)
    out = decode_attention_reference(**a, sliding_window=case["window"])
    for b, (row, n) in enumerate(zip(a["req_pool_indices"].tolist(), case["seq_lens"])):
        slots = a["req_to_token"][row, :n].long()
        expected = _sdpa_one(
            a["q"][b : b + 1], a["k_buffer"], a["v_buffer"], slots, torch.tensor([n - 1]), case["window"]
        )
        torch.testing.assert_close(out[b].float(), expected[0], **TOLERANCE[case["dtype"]])


@pytest.mark.parametrize("case", EXTEND_CASES, ids=[c["id"] for c in EXTEND_CASES])
def test_extend_reference_matches_sdpa(case):
    from langrt_kernels.extend_attention import extend_attention_reference

    a, max_extend = extend_args(case)
    out = extend_attention_reference(**a, max_extend_len=max_extend, sliding_window=case["window"])
    bounds = a["qo_indptr"].tolist()
    for b, row in enumerate(a["req_pool_indices"].tolist()):
        prefix, n = case["prefix"][b], case["extend"][b]
        slots = a["req_to_token"][row, : prefix + n].long()
        rows = slice(bounds[b], bounds[b + 1])
        expected = _sdpa_one(
            a["q"][rows], a["k_buffer"], a["v_buffer"], slots, torch.arange(prefix, prefix + n), case["window"]
        )
        torch.testing.assert_close(out[rows].float(), expected, **TOLERANCE[case["dtype"]])


def test_references_see_the_prefix_and_the_window():
    # Guards the comparisons against masks that hide nothing or everything.
    from langrt_kernels.extend_attention import extend_attention_reference

    a, max_extend = extend_args(EXTEND_CASES[0])
    full = extend_attention_reference(**a, max_extend_len=max_extend)
    windowed = extend_attention_reference(**a, max_extend_len=max_extend, sliding_window=2)
    a["k_buffer"][a["req_to_token"][a["req_pool_indices"][1], 0].long()] += 5.0  # request 1's first prefix key
    moved = extend_attention_reference(**a, max_extend_len=max_extend)
    assert not torch.equal(full, windowed)
    assert torch.equal(full[:9], moved[:9]) and not torch.equal(full[9], moved[9])


# --- launcher and reference argument errors -----------------------------------------------------


def _decode_bad_calls():
    good = decode_args(DECODE_CASES[0])  # float32, 2 heads of 64, 2 KV heads

    def bad(**changes):
        return {**good, **changes}

    return [
        (
            "int_q",
            bad(q=good["q"].long()),
            TypeError,
            "q must be a float32, float16 or bfloat16 tensor, got torch.int64",
        ),
        ("2d_q", bad(q=good["q"][:, 0]), ValueError, r"q must be 3-D \[batch, heads, head_dim\], got shape \(3, 64\)"),
        (
            "strided_q",
            bad(q=good["q"].transpose(1, 2)),
            ValueError,
            r"q must be contiguous in its last dimension; pass q.contiguous\(\)",
        ),
        (
            "kv_dtype",
            bad(k_buffer=good["k_buffer"].bfloat16()),
            TypeError,
            "k_buffer is torch.bfloat16 but q is torch.float32; cast one",
        ),
        ("kv_shapes", bad(v_buffer=good["v_buffer"][:, :1]), ValueError, "k_buffer .* and v_buffer .* differ in shape"),
        ("head_dim", bad(q=torch.zeros(3, 2, 32)), ValueError, "q has head_dim 32 but the KV buffers 64"),
        ("gqa", bad(q=torch.zeros(3, 3, 64)), ValueError, "q's 3 heads are not a multiple of the KV buffers' 2 heads"),
        (
            "req_to_token_int64",
            bad(req_to_token=good["req_to_token"].long()),
            TypeError,
            "req_to_token must be an int32 tensor",
        ),
        ("float_lens", bad(seq_lens=good["seq_lens"].float()), TypeError, "seq_lens must be an int32 or int64 tensor"),
        (
            "batch",
            bad(seq_lens=good["seq_lens"][:2]),
            ValueError,
            "q has 3 rows but req_pool_indices has 3 and seq_lens 2",
        ),
    ]


def _extend_bad_calls():
    good, max_extend = extend_args(EXTEND_CASES[0])
    good["max_extend_len"] = max_extend

    def bad(**changes):
        return {**good, **changes}

    return [
        (
            "int_q",
            bad(q=good["q"].int()),
            TypeError,
            "q must be a float32, float16 or bfloat16 tensor, got torch.int32",
        ),
        ("4d_q", bad(q=good["q"][None]), ValueError, r"q must be 3-D \[tokens, heads, head_dim\]"),
        (
            "kv_dtype",
            bad(v_buffer=good["v_buffer"].half()),
            TypeError,
            "v_buffer is torch.float16 but q is torch.float32",
        ),
        (
            "gqa",
            bad(k_buffer=torch.zeros(8, 3, 64), v_buffer=torch.zeros(8, 3, 64)),
            ValueError,
            "q's 2 heads are not a multiple",
        ),
        ("indptr_len", bad(qo_indptr=good["qo_indptr"][:3]), ValueError, "qo_indptr 4; got 3 and 3"),
        (
            "indptr_dtype",
            bad(qo_indptr=good["qo_indptr"].float()),
            TypeError,
            "qo_indptr must be an int32 or int64 tensor",
        ),
        ("window", bad(sliding_window=0), ValueError, "sliding_window must be >= 1 or None, got 0"),
    ]


DECODE_BAD = _decode_bad_calls()
EXTEND_BAD = _extend_bad_calls()


@pytest.mark.parametrize("entry", ["decode_attention_triton", "decode_attention_reference"])
@pytest.mark.parametrize("bad", DECODE_BAD, ids=[b[0] for b in DECODE_BAD])
def test_decode_bad_arguments_are_refused_with_a_reason(entry, bad):
    import langrt_kernels.decode_attention as module

    _, kwargs, error, message = bad
    with pytest.raises(error, match=message):
        getattr(module, entry)(**kwargs)


@pytest.mark.parametrize("entry", ["extend_attention_triton", "extend_attention_reference"])
@pytest.mark.parametrize("bad", EXTEND_BAD, ids=[b[0] for b in EXTEND_BAD])
def test_extend_bad_arguments_are_refused_with_a_reason(entry, bad):
    import langrt_kernels.extend_attention as module

    _, kwargs, error, message = bad
    with pytest.raises(error, match=message):
        getattr(module, entry)(**kwargs)


def test_decode_launcher_refuses_zero_splits():
    from langrt_kernels.decode_attention import decode_attention_triton

    with pytest.raises(ValueError, match="num_kv_splits must be >= 1, got 0"):
        decode_attention_triton(**decode_args(DECODE_CASES[0]), num_kv_splits=0)


def test_launchers_refuse_tensors_on_two_devices():
    from langrt_kernels.decode_attention import decode_attention_triton
    from langrt_kernels.extend_attention import extend_attention_triton

    args = decode_args(DECODE_CASES[0])
    with pytest.raises(ValueError, match="seq_lens is on meta but q is on cpu; move them to one device"):
        decode_attention_triton(**{**args, "seq_lens": args["seq_lens"].to("meta")})
    args, max_extend = extend_args(EXTEND_CASES[0])
    with pytest.raises(ValueError, match="qo_indptr is on meta but q is on cpu"):
        extend_attention_triton(**{**args, "qo_indptr": args["qo_indptr"].to("meta")}, max_extend_len=max_extend)


def test_launchers_refuse_cpu_tensors_outside_the_interpreter():
    import langrt_kernels.decode_attention as decode
    import langrt_kernels.extend_attention as extend

    if decode.is_interpreted() or extend.is_interpreted():
        pytest.fail("this process imported triton with TRITON_INTERPRET=1; run the tests without it")
    with pytest.raises(
        ValueError, match="decode_attention_triton needs CUDA tensors, got cpu; use decode_attention_reference"
    ):
        decode.decode_attention_triton(**decode_args(DECODE_CASES[0]))
    args, max_extend = extend_args(EXTEND_CASES[0])
    with pytest.raises(ValueError, match="extend_attention_triton needs CUDA tensors, got cpu"):
        extend.extend_attention_triton(**args, max_extend_len=max_extend)


# --- choosing the backend -----------------------------------------------------------------------


def test_auto_backend_is_triton_on_cuda(monkeypatch):
    from langrt.server_args import ServerArgs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = ServerArgs(device="cuda", dtype="bfloat16").resolve()
    assert args.attention_backend == "triton"
    assert ServerArgs(device="cuda", dtype="bfloat16", attention_backend="torch").resolve().attention_backend == "torch"


def test_triton_backend_on_cpu_needs_the_interpreter(monkeypatch):
    from langrt.server_args import ServerArgs

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        ValueError, match="--attention-backend triton needs --device cuda; on CPU use --attention-backend cpu or torch"
    ):
        ServerArgs(device="cpu", attention_backend="triton").resolve()


def test_cli_choices_match_the_factory():
    from langrt.model.attention import ATTENTION_BACKENDS
    from langrt.server_args import ATTENTION_BACKENDS as FLAG_CHOICES

    assert FLAG_CHOICES == ("auto", *ATTENTION_BACKENDS)


def test_factory_refuses_triton_on_cpu_outside_the_interpreter():
    from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
    from langrt.model.attention import create_attention_backend

    kv_pool, req_pool = TokenToKVPool(16, 1, 2, 16, torch.float32, "cpu"), ReqToTokenPool(2, 16, "cpu")
    with pytest.raises(ValueError, match="--attention-backend triton needs --device cuda"):
        create_attention_backend("triton", object(), kv_pool, req_pool)


# --- the kernels and the backend in the interpreter (subprocess) ---------------------------------


@pytest.fixture(scope="module")
def interpreter_results(tiny_llama_dir, tiny_model_builder, tmp_path_factory):
    windowed = tmp_path_factory.mktemp("tiny_llama_window")
    tiny_model_builder("llama", windowed, seed=3, sliding_window=8)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, __file__, "--interpreter-worker", str(tiny_llama_dir), str(windowed)]
    result = subprocess.run(command, check=False, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    if result.returncode != 0 or not result.stdout.strip():
        pytest.fail(f"the Triton interpreter worker failed (rc={result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_interpreter_worker_ran_the_interpreter(interpreter_results):
    assert interpreter_results["interpreted"] is True


@pytest.mark.parametrize("case_id", [c["id"] for c in DECODE_CASES])
def test_decode_kernel_matches_reference(interpreter_results, case_id):
    assert interpreter_results["decode"][case_id] == "ok"


@pytest.mark.parametrize("case_id", [c["id"] for c in EXTEND_CASES])
def test_extend_kernel_matches_reference(interpreter_results, case_id):
    assert interpreter_results["extend"][case_id] == "ok"


def test_decode_kernel_writes_into_out(interpreter_results):
    assert interpreter_results["out_param"] == "ok"


def test_interpreted_launcher_refuses_non_cpu_tensors(interpreter_results):
    assert (
        "the Triton interpreter (TRITON_INTERPRET=1) runs on CPU tensors, got meta"
        in interpreter_results["device_error"]
    )


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_llama_window8"])
def test_triton_backend_gives_the_torch_backends_greedy_tokens(interpreter_results, model):
    run = interpreter_results["models"][model]
    assert run["backends"] == ["triton", "torch"]
    assert run["triton_tokens"] == run["torch_tokens"]
    assert len(run["torch_tokens"][0]) == GREEDY_STEPS + 1
    assert run["max_logit_diff"] < 1e-3


# --- on a GPU -----------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
@pytest.mark.parametrize("case", DECODE_CASES, ids=[c["id"] for c in DECODE_CASES])
def test_decode_kernel_on_cuda_matches_reference(case):
    from langrt_kernels.decode_attention import decode_attention_reference, decode_attention_triton

    a = {name: t.cuda() for name, t in decode_args(case).items()}
    out = decode_attention_triton(**a, sliding_window=case["window"], num_kv_splits=case["splits"])
    assert _compare(out, decode_attention_reference(**a, sliding_window=case["window"]), case["dtype"]) == "ok"


@needs_cuda
@pytest.mark.parametrize("case", EXTEND_CASES, ids=[c["id"] for c in EXTEND_CASES])
def test_extend_kernel_on_cuda_matches_reference(case):
    from langrt_kernels.extend_attention import extend_attention_reference, extend_attention_triton

    a, max_extend = extend_args(case)
    a = {name: t.cuda() for name, t in a.items()}
    out = extend_attention_triton(**a, max_extend_len=max_extend, sliding_window=case["window"])
    assert _compare(out, extend_attention_reference(**a, sliding_window=case["window"]), case["dtype"]) == "ok"


@needs_cuda
def test_triton_backend_on_cuda_gives_the_torch_backends_greedy_tokens_on_smollm(smollm_path):
    triton_tokens, triton_logits = _greedy(smollm_path, "triton", "cuda")
    torch_tokens, torch_logits = _greedy(smollm_path, "torch", "cuda")
    assert triton_tokens == torch_tokens
    assert max((a - b).abs().max().item() for a, b in zip(triton_logits, torch_logits)) < 1e-2


# --- the worker ---------------------------------------------------------------------------------

GREEDY_STEPS = 6


def _compare(out: torch.Tensor, expected: torch.Tensor, dtype: str) -> str:
    try:
        torch.testing.assert_close(out.float(), expected.float(), **TOLERANCE[dtype])
    except AssertionError as error:
        return str(error)[:500]
    return "ok"


def _run_kernel_cases(report: dict) -> None:
    from langrt_kernels.decode_attention import decode_attention_reference, decode_attention_triton
    from langrt_kernels.extend_attention import extend_attention_reference, extend_attention_triton

    for case in DECODE_CASES:
        a = decode_args(case)
        try:
            out = decode_attention_triton(**a, sliding_window=case["window"], num_kv_splits=case["splits"])
            report["decode"][case["id"]] = _compare(
                out, decode_attention_reference(**a, sliding_window=case["window"]), case["dtype"]
            )
        except Exception as error:  # noqa: BLE001 - reported to the parent test, which fails on it
            report["decode"][case["id"]] = f"raised {type(error).__name__}: {error}"
    for case in EXTEND_CASES:
        a, max_extend = extend_args(case)
        try:
            out = extend_attention_triton(**a, max_extend_len=max_extend, sliding_window=case["window"])
            expected = extend_attention_reference(**a, sliding_window=case["window"])
            report["extend"][case["id"]] = _compare(out, expected, case["dtype"])
        except Exception as error:  # noqa: BLE001
            report["extend"][case["id"]] = f"raised {type(error).__name__}: {error}"
    a = decode_args(DECODE_CASES[0])
    wide = torch.full((3, a["q"].shape[1], 64 + 8), 7.0)
    out = wide[..., :64]  # rows and heads strided: the backend passes views like this
    decode_attention_triton(**a, num_kv_splits=2, out=out)
    ok = torch.equal(wide[..., 64:], torch.full_like(wide[..., 64:], 7.0))
    report["out_param"] = _compare(out, decode_attention_reference(**a), "float32") if ok else "wrote past out"
    meta = {k: v.to("meta") for k, v in a.items()}
    try:
        decode_attention_triton(**meta, num_kv_splits=1)
        report["device_error"] = "no error"
    except ValueError as error:
        report["device_error"] = str(error)


def _runner(model_path, backend: str, device: str):
    from langrt.model.model_runner import ModelRunner
    from langrt.model.source import ModelSource
    from langrt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(model_path), dtype="float32", device=device, attention_backend=backend, max_total_tokens=512,
        max_running_requests=8,
    ).resolve()  # fmt: skip
    source = ModelSource.resolve(args.model_path)
    return ModelRunner(args, source, source.model_config(), progress=False)


def _greedy(model_path, backend: str, device: str = "cpu") -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill three ragged prompts (one reusing another's cached prefix), then decode greedily."""
    from runner_driver import RunnerDriver

    runner = _runner(model_path, backend, device)
    assert runner.args.attention_backend == backend
    driver = RunnerDriver(runner)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(17, 49152, (n,), generator=gen).tolist() for n in (5, 23, 12)]
    prompts.append(prompts[1][:20] + prompts[2][:7])  # extends request 1's first 20 tokens
    first = driver.prefill(prompts[:3])
    last = first + driver.prefill(prompts[3:], prefix_from=[(1, 20)])
    tokens = [[int(x[-1].argmax())] for x in last]
    logits = [torch.stack([x[-1] for x in last]).cpu()]
    for _ in range(GREEDY_STEPS):
        step = driver.decode(list(range(4)), [t[-1] for t in tokens])
        logits.append(step.cpu())
        for t, row in zip(tokens, step):
            t.append(int(row.argmax()))
    return tokens, logits


def _run_model_cases(report: dict, model_dirs: dict[str, str]) -> None:
    for name, path in model_dirs.items():
        run = {"backends": []}
        for backend in ("triton", "torch"):
            tokens, logits = _greedy(path, backend)
            run["backends"].append(backend)
            run[f"{backend}_tokens"], run[f"{backend}_logits"] = tokens, logits
        diffs = [(a - b).abs().max().item() for a, b in zip(run.pop("triton_logits"), run.pop("torch_logits"))]
        run["max_logit_diff"] = max(diffs)
        report["models"][name] = run


def _interpreter_worker(tiny_dir: str, windowed_dir: str) -> dict:
    os.environ["TRITON_INTERPRET"] = "1"  # before kernels (and so triton) is imported
    import langrt_kernels.decode_attention as decode

    report = {"interpreted": decode.is_interpreted(), "decode": {}, "extend": {}, "models": {}}
    _run_kernel_cases(report)
    _run_model_cases(report, {"tiny_llama": tiny_dir, "tiny_llama_window8": windowed_dir})
    return report


if __name__ == "__main__" and sys.argv[1:2] == ["--interpreter-worker"]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for runner_driver
    torch.set_num_threads(1)
    print(json.dumps(_interpreter_worker(*sys.argv[2:4])))
