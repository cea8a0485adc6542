"""Applying a packed token bitmask to logits: the reference, the CPU path and the Triton kernel.

The reference is checked against a per-token loop; the CPU path and the Triton launcher against
the reference. The launcher runs in Triton's interpreter on CPU tensors, in a subprocess started
with TRITON_INTERPRET=1 (so the variable never leaks into this process or other tests); that
subprocess is this file run as a script, and if it cannot run the kernel the tests fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from langrt.constrained.bitmask import allocate_token_bitmask, apply_token_bitmask, fill_all

NEG_INF = float("-inf")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPO = Path(__file__).resolve().parents[2]


# --- helpers shared with the interpreter subprocess ---------------------------------------------


def make_bitmask(rows: int, words: int, seed: int) -> torch.Tensor:
    """Row 0 allows everything, row 1 nothing, row 2 one token in every third word, the rest random."""
    gen = torch.Generator().manual_seed(seed)
    bitmask = torch.randint(-(2**31), 2**31, (rows, words), dtype=torch.int32, generator=gen)
    if rows > 0:
        bitmask[0] = -1
    if rows > 1:
        bitmask[1] = 0
    if rows > 2:
        bitmask[2] = 0
        bitmask[2, ::3] = 1 << 5
    return bitmask


def make_logits(rows: int, vocab: int, dtype: torch.dtype, seed: int, pad: int = 0) -> torch.Tensor:
    """Random logits; with `pad`, a column slice of a wider buffer (row stride vocab + pad)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab + pad, generator=gen).to(dtype)[:, :vocab]


def naive_apply(logits: torch.Tensor, bitmask: torch.Tensor, indices: list[int] | None) -> None:
    """The specification, one token at a time."""
    words = bitmask.tolist()
    rows = range(len(words)) if indices is None else indices
    for k, row in enumerate(rows):
        for token in range(logits.shape[1]):
            w, j = divmod(token, 32)
            if w >= len(words[k]) or not (words[k][w] >> j) & 1:
                logits[row, token] = NEG_INF


# (id, dtype, logits rows, vocab, mask words, indices or None, row padding of the logits)
SHAPES = [
    ("exact", 4, 128, 4, None, 0),
    ("vocab33", 3, 33, 2, None, 0),
    ("vocab1", 2, 1, 1, None, 0),
    ("wider_mask", 3, 100, 6, None, 0),
    ("narrow_mask", 3, 100, 2, None, 0),  # columns 64..99 are past the mask: disallowed
    ("no_words", 2, 40, 0, None, 0),
    ("multi_block", 3, 4133, 130, None, 0),
    ("strided_rows", 3, 70, 3, None, 9),
    ("indices", 5, 100, 4, [4, 0, 2], 0),
    ("indices_dup", 4, 70, 3, [1, 3, 1], 0),
    ("indices_one", 4, 37, 2, [2], 0),
    ("indices_narrow", 4, 100, 1, [3, 0], 0),
    ("indices_empty", 3, 50, 2, [], 0),
]
CASES = [(f"{name}-{dtype}", dtype, *rest) for name, *rest in SHAPES for dtype in DTYPES]


def case_tensors(case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    _, dtype, rows, vocab, words, indices, pad = case
    mask_rows = rows if indices is None else len(indices)
    logits = make_logits(rows, vocab, DTYPES[dtype], seed=rows * 1000 + vocab, pad=pad)
    index_tensor = None if indices is None else torch.tensor(indices, dtype=torch.int32)
    return logits, make_bitmask(mask_rows, words, seed=vocab), index_tensor


# --- the reference against the per-token loop ---------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reference_matches_naive_loop(case):
    from langrt_kernels.grammar_bitmask import apply_token_bitmask_reference

    logits, bitmask, indices = case_tensors(case)
    expected = logits.clone()
    naive_apply(expected, bitmask, None if indices is None else indices.tolist())
    apply_token_bitmask_reference(logits, bitmask, indices)
    assert torch.equal(logits, expected)


def test_reference_bans_something_and_keeps_the_rest():
    # Guards the comparisons above against two no-ops agreeing.
    from langrt_kernels.grammar_bitmask import apply_token_bitmask_reference

    logits = make_logits(3, 100, torch.float32, seed=0)
    original = logits.clone()
    apply_token_bitmask_reference(logits, make_bitmask(3, 4, seed=1))
    assert torch.equal(logits[0], original[0])  # fully allowed
    assert torch.isneginf(logits[1]).all()  # fully banned
    assert 0 < torch.isneginf(logits[2]).sum() < 100
    kept = ~torch.isneginf(logits)
    assert torch.equal(logits[kept], original[kept])


# --- the CPU serving path against the reference --------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cpu_path_matches_reference(case):
    from langrt_kernels.grammar_bitmask import apply_token_bitmask_reference

    logits, bitmask, indices = case_tensors(case)
    expected = logits.clone()
    apply_token_bitmask_reference(expected, bitmask, indices)
    apply_token_bitmask(logits, bitmask, indices)
    assert torch.equal(logits, expected)


@pytest.mark.parametrize(
    "rows,vocab,indices",
    [
        (1, 49152, None),  # the single-row fast path
        (23, 49152, None),  # several row chunks
        (3, 151936, None),  # padded Qwen-size vocab: mask built for 151,665 tokens below
        (23, 49152, [22, 0, 5, 5, 7, 1, 9, 10, 11, 12, 13, 14, 2, 3, 4, 6, 8, 0]),  # chunks, repeats
    ],
)
def test_cpu_path_matches_reference_on_model_sizes(rows, vocab, indices):
    from langrt_kernels.grammar_bitmask import apply_token_bitmask_reference

    tokenizer_vocab = 151665 if vocab == 151936 else vocab
    mask_rows = rows if indices is None else len(indices)
    bitmask = make_bitmask(mask_rows, (tokenizer_vocab + 31) // 32, seed=rows)
    index_tensor = None if indices is None else torch.tensor(indices)
    logits = make_logits(rows, vocab, torch.float32, seed=vocab)
    expected = logits.clone()
    apply_token_bitmask_reference(expected, bitmask, index_tensor)
    apply_token_bitmask(logits, bitmask, index_tensor)
    assert torch.equal(logits, expected)
    if vocab == 151936:
        assert torch.isneginf(logits[:, 151680:]).all()  # past the mask's 4,740 words


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 5),
    vocab=st.integers(1, 130),
    extra_words=st.integers(-2, 2),
    seed=st.integers(0, 2**16),
    use_indices=st.booleans(),
)
def test_cpu_path_matches_naive_loop(rows, vocab, extra_words, seed, use_indices):
    words = max(0, (vocab + 31) // 32 + extra_words)
    gen = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, rows, (int(torch.randint(0, 2 * rows, (1,), generator=gen)),), generator=gen).tolist()
    indices = indices if use_indices else None
    bitmask = make_bitmask(rows if indices is None else len(indices), words, seed)
    logits = make_logits(rows, vocab, torch.float32, seed)
    expected = logits.clone()
    naive_apply(expected, bitmask, indices)
    apply_token_bitmask(logits, bitmask, None if indices is None else torch.tensor(indices, dtype=torch.long))
    assert torch.equal(logits, expected)


def test_cpu_path_handles_infinite_logits():
    logits = torch.tensor([[float("inf"), float("inf"), NEG_INF, NEG_INF, 1.0]])
    bitmask = torch.tensor([[0b00101]], dtype=torch.int32)  # tokens 0 and 2 allowed
    apply_token_bitmask(logits, bitmask)
    assert logits.tolist() == [[float("inf"), NEG_INF, NEG_INF, NEG_INF, NEG_INF]]


def test_cpu_path_leaves_unlisted_rows_and_padding_columns_alone():
    buffer = torch.randn(4, 80)
    original = buffer.clone()
    apply_token_bitmask(buffer[:, :70], torch.zeros(2, 3, dtype=torch.int32), torch.tensor([3, 1]))
    assert torch.isneginf(buffer[[1, 3], :70]).all()
    assert torch.equal(buffer[[0, 2]], original[[0, 2]])
    assert torch.equal(buffer[:, 70:], original[:, 70:])


def test_cpu_path_imports_neither_triton_nor_kernels():
    code = (
        "import sys, torch\n"
        "from langrt.constrained.bitmask import allocate_token_bitmask, apply_token_bitmask\n"
        "logits = torch.zeros(2, 40)\n"
        "apply_token_bitmask(logits, allocate_token_bitmask(2, 40))\n"
        "assert not any(m == 'triton' or m.startswith(('triton.', 'kernels')) for m in sys.modules), sorted(sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr


# --- allocation and filling ---------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 49152, 151665])
def test_allocate_allows_exactly_the_vocabulary(vocab):
    bitmask = allocate_token_bitmask(3, vocab)
    assert bitmask.shape == (3, (vocab + 31) // 32) and bitmask.dtype == torch.int32
    logits = torch.zeros(3, 32 * bitmask.shape[1] + 5)  # a model vocab padded past the mask
    apply_token_bitmask(logits, bitmask)
    assert not torch.isneginf(logits[:, :vocab]).any()
    assert torch.isneginf(logits[:, vocab:]).all()


def test_fill_all_resets_one_row():
    bitmask = torch.zeros(3, 2, dtype=torch.int32)
    fill_all(bitmask, 1)
    assert bitmask.tolist() == [[0, 0], [-1, -1], [0, 0]]
    fill_all(bitmask, 2, vocab_size=33)
    assert bitmask.tolist()[2] == [-1, 1]
    fill_all(bitmask, 0, vocab_size=32)
    assert bitmask.tolist()[0] == [-1, 0]


def test_fill_all_and_allocate_refuse_bad_arguments():
    bitmask = torch.zeros(3, 2, dtype=torch.int32)
    with pytest.raises(IndexError, match="row 3 is outside the bitmask's 3 rows"):
        fill_all(bitmask, 3)
    with pytest.raises(ValueError, match="vocab_size 65 needs 3 words, the bitmask has 2"):
        fill_all(bitmask, 0, vocab_size=65)
    with pytest.raises(TypeError, match="bitmask must be an int32 tensor"):
        fill_all(bitmask.long(), 0)
    with pytest.raises(ValueError, match="vocab_size >= 1"):
        allocate_token_bitmask(2, 0)


# --- argument errors (shared by the CPU path, the reference and the launcher) ---------------------


def _bad_calls():
    logits, bitmask = torch.zeros(2, 40), torch.zeros(2, 2, dtype=torch.int32)
    return [
        (
            "int_logits",
            (logits.long(), bitmask, None),
            TypeError,
            "logits must be a float32, float16 or bfloat16 tensor, got torch.int64",
        ),
        ("float64_logits", (logits.double(), bitmask, None), TypeError, "got torch.float64"),
        (
            "1d_logits",
            (logits[0], bitmask, None),
            ValueError,
            r"logits must be 2-D \[batch, vocab\], got shape \(40,\)",
        ),
        (
            "strided_vocab",
            (torch.zeros(2, 80)[:, ::2], bitmask, None),
            ValueError,
            "logits must be contiguous along the vocab dimension",
        ),
        ("int64_mask", (logits, bitmask.long(), None), TypeError, "bitmask must be an int32 tensor"),
        ("3d_mask", (logits, bitmask[None], None), ValueError, r"bitmask must be 2-D \[batch, ceil\(vocab/32\)\]"),
        (
            "strided_mask",
            (logits, torch.zeros(2, 4, dtype=torch.int32)[:, ::2], None),
            ValueError,
            r"pass bitmask.contiguous\(\)",
        ),
        (
            "row_mismatch",
            (logits, torch.zeros(3, 2, dtype=torch.int32), None),
            ValueError,
            r"bitmask has 3 rows but logits have 2.*bitmask\[:2\]",
        ),
        ("mask_device", (logits, bitmask.to("meta"), None), ValueError, r"bitmask is on meta but logits are on cpu"),
        ("float_indices", (logits, bitmask, torch.zeros(2)), TypeError, "indices must be an int32 or int64 tensor"),
        ("2d_indices", (logits, bitmask, torch.zeros(2, 1, dtype=torch.long)), ValueError, "indices must be 1-D"),
        (
            "indices_count",
            (logits, bitmask, torch.tensor([0])),
            ValueError,
            "bitmask has 2 rows but indices has 1 entries",
        ),
        (
            "indices_range",
            (logits, bitmask, torch.tensor([0, 2])),
            ValueError,
            r"indices must be rows of logits \(0 <= i < 2\), got 2",
        ),
        ("negative_index", (logits, bitmask, torch.tensor([-1, 0])), ValueError, "got -1"),
        ("indices_device", (logits, bitmask, torch.tensor([0, 1], device="meta")), ValueError, "indices are on meta"),
    ]


BAD_CALLS = _bad_calls()


@pytest.mark.parametrize(
    "entry", ["apply_token_bitmask", "apply_token_bitmask_reference", "apply_token_bitmask_triton"]
)
@pytest.mark.parametrize("bad", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_arguments_are_refused_with_a_reason(entry, bad):
    import langrt_kernels.grammar_bitmask as kernel_module

    fn = apply_token_bitmask if entry == "apply_token_bitmask" else getattr(kernel_module, entry)
    _, args, error, message = bad
    with pytest.raises(error, match=message):
        fn(*args)


def test_launcher_refuses_cpu_tensors_outside_the_interpreter():
    import langrt_kernels.grammar_bitmask as kernel_module

    if kernel_module.is_interpreted():
        pytest.fail("this process imported triton with TRITON_INTERPRET=1; run the tests without it")
    with pytest.raises(ValueError, match="needs CUDA tensors, got cpu"):
        kernel_module.apply_token_bitmask_triton(torch.zeros(2, 40), torch.zeros(2, 2, dtype=torch.int32))


# --- the Triton kernel in the interpreter (subprocess) ---------------------------------------------


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
    assert interpreter_results["triton_version"]


@pytest.mark.parametrize("case_id", [c[0] for c in CASES])
def test_triton_kernel_matches_reference(interpreter_results, case_id):
    assert interpreter_results["cases"][case_id] == "equal"


def test_interpreted_launcher_refuses_non_cpu_tensors(interpreter_results):
    assert (
        "the Triton interpreter (TRITON_INTERPRET=1) runs on CPU tensors, got meta"
        in interpreter_results["device_error"]
    )


def _interpreter_worker() -> dict:
    """Run every case through the interpreted launcher; report per case, never raise per case."""
    os.environ["TRITON_INTERPRET"] = "1"  # before kernels (and so triton) is imported
    import triton

    import langrt_kernels.grammar_bitmask as kernel_module

    report = {"interpreted": kernel_module.is_interpreted(), "triton_version": triton.__version__, "cases": {}}
    for case in CASES:
        logits, bitmask, indices = case_tensors(case)
        expected = logits.clone()
        kernel_module.apply_token_bitmask_reference(expected, bitmask, indices)
        try:
            kernel_module.apply_token_bitmask_triton(logits, bitmask, indices)
            outcome = (
                "equal"
                if torch.equal(logits, expected)
                else f"differs at {(logits != expected).nonzero().tolist()[:5]}"
            )
        except Exception as error:  # noqa: BLE001 - reported to the parent test, which fails on it
            outcome = f"raised {type(error).__name__}: {error}"
        report["cases"][case[0]] = outcome
    try:
        kernel_module.apply_token_bitmask_triton(
            torch.zeros(2, 40, device="meta"), torch.zeros(2, 2, dtype=torch.int32, device="meta")
        )
        report["device_error"] = "no error"
    except ValueError as error:
        report["device_error"] = str(error)
    return report


# --- on a GPU ------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("indices", [None, [7, 0, 3, 3, 30]], ids=["rows", "indices"])
@pytest.mark.parametrize("vocab,words", [(49152, 1536), (151936, 4740), (1000, 40)])
def test_cuda_dispatch_matches_reference(dtype, indices, vocab, words):
    from langrt_kernels.grammar_bitmask import apply_token_bitmask_reference

    rows = 32
    bitmask = make_bitmask(rows if indices is None else len(indices), words, seed=vocab).cuda()
    index_tensor = None if indices is None else torch.tensor(indices, device="cuda")
    logits = make_logits(rows, vocab, dtype, seed=vocab).cuda()
    expected = logits.clone()
    apply_token_bitmask_reference(expected, bitmask, index_tensor)
    apply_token_bitmask(logits, bitmask, index_tensor)  # dispatches to the Triton kernel
    torch.cuda.synchronize()
    assert torch.equal(logits, expected)


if __name__ == "__main__" and sys.argv[1:] == ["--interpreter-worker"]:
    print(json.dumps(_interpreter_worker()))
