"""langrt's CPU attention kernel (kernels/cpu) and the cpu attention backend built on it.

The kernel is checked against attention computed in float64 on K/V gathered by hand, for
ragged rows (several rows of one request, as jump-forward drafts and prompts are), GQA ratios, head sizes,
sliding windows and strided views; then for the property the backend relies on (a row's output
does not depend on the other rows in the call), its refusals, and the backend against the torch
backend on tiny models. The kernel tests run each build this CPU has (AVX-512F, AVX2 + FMA; the
cpu_isa fixture); on a CPU with neither they are skipped and the backend is the torch backend
(test_backend_falls_back_to_torch_with_a_reason).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from langrt_kernels.cpu import paged_attention, reset, unavailable_reason

needs_kernel = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"CPU kernel unavailable: {unavailable_reason()}"
)


@pytest.fixture(scope="module")
def kernel(cpu_isa):
    op = paged_attention()
    assert op is not None, f"the {cpu_isa} kernel should build on this CPU (see the warning logged)"
    return op


def _case(dtype, heads, kv_heads, dim, seed, window=None, rows_per_req=(1, 4, 1, 7, 2)):
    """A pool of 600 slots, five requests with shuffled slots, and rows for some tokens of each."""
    gen = torch.Generator().manual_seed(seed)
    slots, table_width = 600, 300
    k = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    lengths = [int(x) for x in torch.randint(1, 260, (len(rows_per_req),), generator=gen)]
    lengths[0] = 1  # a request whose only key is its own token
    lengths[2] = 16  # exactly one block of keys
    lengths = [max(n, e) for n, e in zip(lengths, rows_per_req)]
    table = torch.zeros(len(rows_per_req) + 2, table_width, dtype=torch.int32)
    perm = torch.randperm(slots, generator=gen)
    reqs_rows = [6, 0, 3, 1, 5]  # request rows in the table are not 0..4
    used = 0
    for req, n in zip(reqs_rows, lengths):
        table[req, :n] = perm[used : used + n].to(torch.int32)
        used += n
    rows, reqs, starts, ends = [], [], [], []
    for req, n, e in zip(reqs_rows, lengths, rows_per_req):
        for i in range(e):  # the last e tokens of the request, as a decode or drafts would be
            end = n - e + i + 1
            reqs.append(req)
            ends.append(end)
            starts.append(0 if window is None else max(0, end - window))
    total = len(ends)
    order = torch.randperm(total, generator=gen)  # rows of q in no particular order
    rows = order.tolist()
    wide = torch.randn(total, heads, dim + 16, generator=gen).to(dtype)
    q = wide[..., 8 : 8 + dim]  # strided rows and heads, as a slice of a fused projection is
    return {
        "q": q, "k": k, "v": v, "req_to_token": table,
        "rows": torch.tensor(rows, dtype=torch.int64), "reqs": torch.tensor(reqs, dtype=torch.int64),
        "starts": torch.tensor(starts, dtype=torch.int32), "ends": torch.tensor(ends, dtype=torch.int32),
        "scale": dim**-0.5,
    }  # fmt: skip


def _reference(c):
    """float64 attention per row on K/V gathered by hand."""
    q, heads, kv_heads = c["q"].double(), c["q"].shape[1], c["k"].shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for row, req, start, end in zip(c["rows"].tolist(), c["reqs"].tolist(), c["starts"].tolist(), c["ends"].tolist()):
        idx = c["req_to_token"][req, start:end].long()
        keys = c["k"][idx].double().repeat_interleave(heads // kv_heads, dim=1)  # [L, H, D]
        values = c["v"][idx].double().repeat_interleave(heads // kv_heads, dim=1)
        weights = torch.softmax(torch.einsum("hd,lhd->hl", q[row], keys) * c["scale"], dim=-1)
        out[row] = torch.einsum("hl,lhd->hd", weights, values)
    return out


def _call(kernel, c, out=None):
    out = torch.full(c["q"].shape, float("nan"), dtype=c["q"].dtype) if out is None else out
    kernel(c["q"], c["k"], c["v"], c["req_to_token"], c["rows"], c["reqs"], c["starts"], c["ends"], out, c["scale"])
    return out


SHAPES = [(9, 3, 64), (4, 4, 16), (8, 2, 128), (16, 1, 32), (12, 12, 256)]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"h{h}_kv{k}_d{d}" for h, k, d in SHAPES])
@pytest.mark.parametrize("window", [None, 5], ids=["full", "window5"])
@pytest.mark.parametrize("rows_per_req", [(1, 4, 1, 7, 2), (1, 70, 3, 40, 2)], ids=["drafts", "prompts"])
def test_kernel_matches_float64_attention(kernel, dtype, shape, window, rows_per_req):
    c = _case(dtype, *shape, seed=sum(shape), window=window, rows_per_req=rows_per_req)
    got = _call(kernel, c)
    want = _reference(c)
    assert not got.isnan().any()  # every row given was written
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=2e-6)
    else:  # float32 inside, rounded to nearest once at the end: half a bf16 ulp (at most 2^-8
        # relative) from the exact value, plus float32 accumulation error (which decides near 0)
        assert ((got.double() - want).abs() <= want.abs() * 2**-8 + 1e-6).all()
        assert (got == want.to(torch.bfloat16)).double().mean() > 0.95


@needs_kernel
def test_kernel_writes_only_the_rows_it_is_given(kernel):
    c = _case(torch.float32, 9, 3, 64, seed=1)
    keep = c["rows"][::2].clone()
    for name in ("rows", "reqs", "starts", "ends"):
        c[name] = c[name][::2].contiguous()
    out = _call(kernel, c)
    written = torch.zeros(out.shape[0], dtype=torch.bool)
    written[keep] = True
    assert not out[written].isnan().any() and out[~written].isnan().all()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("rows_per_req", [(1, 4, 1, 7, 2), (1, 70, 3, 40, 2)], ids=["drafts", "prompts"])
def test_a_rows_output_does_not_depend_on_the_other_rows(kernel, dtype, rows_per_req):
    """What lets jump-forward drafts and plain decodes give the same bits: each row alone equals
    the same row computed with all the others. Alone, a row's dot products are taken key by key;
    with 3 or more rows of its request beside it, for 16 keys at once on a transposed block: the
    same float operations in the same order, so the same bits. ("prompts": runs longer than a
    work item's 32 rows, split across threads.)"""
    c = _case(dtype, 9, 3, 64, seed=7, rows_per_req=rows_per_req)
    together = _call(kernel, c)
    for i in range(c["rows"].numel()):
        alone = dict(c, **{name: c[name][i : i + 1] for name in ("rows", "reqs", "starts", "ends")})
        row = int(c["rows"][i])
        assert torch.equal(_call(kernel, alone)[row], together[row])
    # a request's rows are taken together when adjacent (one thread reads its keys once for all
    # of them); listed in any order, split among other requests' rows, the bits are the same
    shuffled = torch.randperm(c["rows"].numel(), generator=torch.Generator().manual_seed(3))
    mixed = dict(c, **{name: c[name][shuffled] for name in ("rows", "reqs", "starts", "ends")})
    assert torch.equal(_call(kernel, mixed), together)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_one_requests_drafts_split_among_threads_give_the_same_bits(kernel, dtype):
    """One request's 9 rows (a token and 8 drafts) over 3 KV heads make fewer work items than
    2 threads want, so the kernel cuts them into smaller chunks: each row still gives what it
    gives alone, and the float64 reference's values."""
    gen = torch.Generator().manual_seed(11)
    k, v = (torch.randn(400, 3, 64, generator=gen).to(dtype) for _ in range(2))
    table = torch.randperm(400, generator=gen).to(torch.int32)[None, :320].contiguous()
    c = {
        "q": torch.randn(9, 9, 64, generator=gen).to(dtype), "k": k, "v": v, "req_to_token": table,
        "rows": torch.arange(9), "reqs": torch.zeros(9, dtype=torch.int64),
        "starts": torch.zeros(9, dtype=torch.int32), "ends": torch.arange(312, 321, dtype=torch.int32), "scale": 0.125,
    }  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        together = _call(kernel, c)
        for i in range(9):
            alone = dict(c, **{name: c[name][i : i + 1] for name in ("rows", "reqs", "starts", "ends")})
            assert torch.equal(_call(kernel, alone)[i], together[i])
    finally:
        torch.set_num_threads(threads)
    want = _reference(c)
    assert ((together.double() - want).abs() <= want.abs() * 2**-8 + 1e-5).all()


def _long_case(dtype, seed):
    """Rows past 512 keys (kernels/cpu/paged_attention.cpp's kSegmentKeys), which the kernel takes
    in segments: a decode whose last segment is one key, a token with 4 drafts over ~1,300 keys, a
    decode over 2,049 and one over a window of 700 keys starting at 1,400, on shuffled slots."""
    gen = torch.Generator().manual_seed(seed)
    slots = 6000
    k, v = (torch.randn(slots, 3, 64, generator=gen).to(dtype) for _ in range(2))
    perm = torch.randperm(slots, generator=gen).to(torch.int32)
    lengths, rows_per_req = [513, 1300, 2049, 2100], [1, 5, 1, 1]
    table = torch.zeros(len(lengths), 2100, dtype=torch.int32)
    used = 0
    for req, n in enumerate(lengths):
        table[req, :n] = perm[used : used + n]
        used += n
    reqs, starts, ends = [], [], []
    for req, (n, e) in enumerate(zip(lengths, rows_per_req)):
        for i in range(e):
            reqs.append(req)
            ends.append(n - e + i + 1)
            starts.append(1400 if req == 3 else 0)
    total = len(ends)
    return {
        "q": torch.randn(total, 9, 64, generator=gen).to(dtype), "k": k, "v": v, "req_to_token": table,
        "rows": torch.arange(total), "reqs": torch.tensor(reqs), "starts": torch.tensor(starts, dtype=torch.int32),
        "ends": torch.tensor(ends, dtype=torch.int32), "scale": 0.125,
    }  # fmt: skip


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_rows_of_many_keys_are_taken_in_segments_with_the_same_bits_however_they_run(kernel, dtype):
    """A decode past 512 keys is split into segments that threads take as separate work items
    (one long sequence keeps both threads reading); the same row among its request's drafts takes
    its segments in turn on one thread. Both give the same bits, alone, together, with 1 to 3
    threads, and the float64 reference's values within float32 rounding (merging the segments
    rescales each once)."""
    c = _long_case(dtype, seed=5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = _call(kernel, c)
        for n in (1, 3):
            torch.set_num_threads(n)
            assert torch.equal(_call(kernel, c), together)
        torch.set_num_threads(2)
        for i in range(c["rows"].numel()):
            alone = dict(c, **{name: c[name][i : i + 1] for name in ("rows", "reqs", "starts", "ends")})
            assert torch.equal(_call(kernel, alone)[i], together[i])
    finally:
        torch.set_num_threads(threads)
    want = _reference(c)
    if dtype == torch.float32:
        torch.testing.assert_close(together.double(), want, atol=2e-6, rtol=2e-6)
    else:
        assert ((together.double() - want).abs() <= want.abs() * 2**-8 + 1e-6).all()


@needs_kernel
def test_bad_calls_are_refused_with_a_reason(kernel):
    c = _case(torch.float32, 9, 3, 64, seed=2)

    def refused(match, **changes):
        bad = dict(c, **changes)
        with pytest.raises(RuntimeError, match=match):
            _call(kernel, bad, out=changes.get("out"))

    table = c["req_to_token"].clone()
    table[c["reqs"][0], 0] = 10_000
    refused("slot 10000 outside the pool", req_to_token=table, starts=torch.zeros_like(c["starts"]))
    refused(r"key range \[3, 3\) is empty", starts=torch.full_like(c["starts"], 3), ends=torch.full_like(c["ends"], 3))
    refused("key range .* outside req_to_token", ends=torch.full_like(c["ends"], 301))
    refused("row 99 outside q", rows=torch.full_like(c["rows"], 99))
    refused("request row 50 outside req_to_token", reqs=torch.full_like(c["reqs"], 50))
    refused("must share a dtype", k=c["k"].double(), v=c["v"].double())
    refused(
        "bfloat16 or float32 only",
        q=c["q"].double(),
        k=c["k"].double(),
        v=c["v"].double(),
        out=torch.empty(c["q"].shape, dtype=torch.float64),
    )
    refused(
        "multiple of 16",
        q=c["q"][..., :8],
        out=torch.empty(c["q"][..., :8].shape),
        k=c["k"][..., :8].contiguous(),
        v=c["v"][..., :8].contiguous(),
    )
    refused("int32 table", req_to_token=c["req_to_token"].long())
    refused("one length", ends=c["ends"][:-1])


# --- the backend ----------------------------------------------------------------------------------


@needs_kernel
@pytest.mark.parametrize("model", ["tiny_llama", "tiny_llama_window8"])
def test_cpu_backend_gives_the_torch_backends_logits(model, tiny_llama_dir, tiny_model_builder, tmp_path):
    """Ragged prompts, one reusing a cached prefix, then greedy decoding: through ModelRunner with
    attention_backend="cpu" and "torch" (float32), same tokens, logits within float32 rounding."""
    from test_kernels_attention import _greedy

    path = tiny_llama_dir
    if model == "tiny_llama_window8":
        path = tmp_path / "windowed"
        tiny_model_builder("llama", path, seed=3, sliding_window=8)
    tokens, logits = _greedy(path, "cpu")
    ref_tokens, ref_logits = _greedy(path, "torch")
    assert tokens == ref_tokens
    assert max((a - b).abs().max().item() for a, b in zip(logits, ref_logits)) < 1e-4


@needs_kernel
def test_cpu_backend_uses_the_kernel_for_decodes_drafts_and_prompts(tiny_llama_dir, monkeypatch):
    from test_kernels_attention import _runner

    from langrt.model.attention import cpu_backend
    from langrt.model.attention.cpu_backend import _KernelAttention

    runner = _runner(tiny_llama_dir, "cpu", "cpu")
    assert runner.attn_backend.kernel is not None

    batch = SimpleNamespace(  # decodes, a request with 3 drafts, and a prompt of 20 tokens
        extend_lens=[1, 1, 4, 20], extend_starts=[0, 1, 2, 6], seq_lens=[9, 30, 12, 20], req_pool_indices=[4, 2, 7, 0],
        input_ids=torch.zeros(26, dtype=torch.int64),
    )  # fmt: skip
    attn = _KernelAttention(runner.attn_backend, batch)
    assert attn.rows.tolist() == list(range(26)) and not attn.extends
    assert attn.reqs.tolist() == [4, 2, 7, 7, 7, 7] + [0] * 20
    assert attn.ends.tolist() == [9, 30, 9, 10, 11, 12] + list(range(1, 21))  # each row sees the keys up to itself
    assert attn.starts == {None: attn.starts[None]} and attn.starts[None].tolist() == [0] * 26
    # a prompt longer than the build's KERNEL_MAX_EXTEND runs torch's SDPA
    monkeypatch.setattr(cpu_backend, "KERNEL_MAX_EXTEND", dict.fromkeys(cpu_backend.KERNEL_MAX_EXTEND, 19))
    attn = _KernelAttention(runner.attn_backend, batch)
    assert attn.rows.tolist() == [0, 1, 2, 3, 4, 5]
    assert len(attn.extends) == 1 and attn.extends[0].extend_len == 20


@needs_kernel
@pytest.mark.parametrize("build", ["avx512", "avx2", "scalar"])
def test_long_prompts_take_the_kernel_on_avx512_and_sdpa_past_1024_tokens_elsewhere(tiny_llama_dir, build):
    """The AVX-512 build attends prompts of any length (1.5x SDPA's speed at 1,500-8,000 tokens on
    the built-in model); the AVX2 and plain C++ builds hand SDPA those past 1,024 tokens (even
    with it at 1,200, slower at 2,000)."""
    from test_kernels_attention import _runner

    from langrt.model.attention.cpu_backend import _KernelAttention

    runner = _runner(tiny_llama_dir, "cpu", "cpu")
    runner.attn_backend.kernel_isa = build
    batch = SimpleNamespace(  # a decode, a prompt of 1,024 tokens and one of 1,500
        extend_lens=[1, 1024, 1500], extend_starts=[0, 1, 1025], seq_lens=[9, 1024, 1500], req_pool_indices=[4, 2, 7],
        input_ids=torch.zeros(2525, dtype=torch.int64),
    )  # fmt: skip
    attn = _KernelAttention(runner.attn_backend, batch)
    if build == "avx512":
        assert attn.rows.numel() == 2525 and not attn.extends
    else:
        assert attn.rows.numel() == 1025 and [e.extend_len for e in attn.extends] == [1500]


def test_backend_falls_back_to_torch_with_a_reason(tiny_llama_dir, monkeypatch, caplog):
    from test_kernels_attention import _runner

    from langrt.model.attention.torch_backend import _TorchAttention

    monkeypatch.setenv("LANGRT_CPU_KERNELS", "0")
    reset()
    try:
        with caplog.at_level(logging.WARNING):
            runner = _runner(tiny_llama_dir, "cpu", "cpu")
    finally:
        reset()
    assert runner.attn_backend.kernel is None
    assert "CPU kernels not used: LANGRT_CPU_KERNELS=0" in caplog.text

    batch = SimpleNamespace(
        extend_lens=[1],
        extend_starts=[0],
        seq_lens=[3],
        req_pool_indices=[0],
        input_ids=torch.zeros(1, dtype=torch.int64),
        num_tokens=1,
    )
    assert isinstance(runner.attn_backend.prepare(batch), _TorchAttention)


def test_auto_backend_is_the_cpu_backend_on_cpu():
    from langrt.server_args import ServerArgs

    assert ServerArgs(device="cpu").resolve().attention_backend == "cpu"
    assert ServerArgs(device="cpu", attention_backend="torch").resolve().attention_backend == "torch"
