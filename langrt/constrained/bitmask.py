"""Packed token bitmasks for constrained decoding, and applying one to a batch of logits.

Layout: an int32 tensor [batch, ceil(V/32)]. Bit j of word w (`(word >> j) & 1`, little-endian
within the int32) is 1 when token `32*w + j` is allowed. Applying a mask sets each disallowed
token's logit to -inf, in place, on the constrained rows only.

Padded vocabularies (the model's logits may be wider than the tokenizer's vocabulary, e.g.
Qwen2's 151,936 logits for 151,665 tokens):
  - mask bits past the logits' width are ignored (a mask may be wider than the logits);
  - logits columns past the mask's coverage (32 * words) are disallowed: they are ids the
    tokenizer cannot produce, so no grammar can allow them;
  - `allocate_token_bitmask(batch, vocab_size)` leaves the bits of ids in [vocab_size, 32 *
    words) clear, so those ids are disallowed too, until a filler sets them on purpose.

Dispatch: CUDA tensors go to the Triton kernel (`kernels.grammar_bitmask`, imported on first
use so importing this module needs only torch); CPU tensors take a torch path built from
vectorized ops (see `_apply_cpu`).
"""

from __future__ import annotations

import functools
import time
import warnings

import torch

# The checks live below langrt so the Triton launcher can share them (docs/architecture.md's layers).
from langrt_kernels.bitmask_args import check_bitmask_tensor, check_token_bitmask_args

# CPU path: rows are processed in chunks of about this many logits so the temporary -inf/+inf
# caps and the logits they are compared with stay in the L2 cache (measured on 32 x 151,936
# fp32, one thread: 5.0 ms unchunked, 2.6 ms in chunks of 2**18).
_CPU_CHUNK_ELEMENTS = 1 << 18


def words_for_vocab(vocab_size: int) -> int:
    """int32 words needed for one row of a mask over `vocab_size` tokens."""
    return (vocab_size + 31) // 32


def allocate_token_bitmask(batch: int, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A [batch, ceil(vocab_size/32)] int32 mask with every token of the vocabulary allowed.

    The bits of ids at or past `vocab_size` in the last word are clear (disallowed), so a
    model whose logits are padded past the tokenizer's vocabulary never samples them.
    """
    if batch < 0 or vocab_size < 1:
        raise ValueError(
            f"allocate_token_bitmask needs batch >= 0 and vocab_size >= 1, got batch={batch}, vocab_size={vocab_size}"
        )
    bitmask = torch.full((batch, words_for_vocab(vocab_size)), -1, dtype=torch.int32, device=device)
    if vocab_size % 32:
        bitmask[:, -1] = _low_bits(vocab_size % 32)
    return bitmask


def fill_all(bitmask: torch.Tensor, row: int, vocab_size: int | None = None) -> None:
    """Allow every token in row `row` of `bitmask` (an unconstrained request in a mixed batch).

    With `vocab_size`, only ids below it are allowed (the tail bits are cleared, as in
    `allocate_token_bitmask`); without it, every bit of the row is set.
    """
    check_bitmask_tensor(bitmask, "bitmask")
    if not 0 <= row < bitmask.shape[0]:
        raise IndexError(f"fill_all: row {row} is outside the bitmask's {bitmask.shape[0]} rows")
    bitmask[row].fill_(-1)
    if vocab_size is not None:
        words = words_for_vocab(vocab_size)
        if words > bitmask.shape[1]:
            raise ValueError(
                f"fill_all: vocab_size {vocab_size} needs {words} words, the bitmask has {bitmask.shape[1]}"
            )
        bitmask[row, words:].zero_()
        if vocab_size % 32:
            bitmask[row, words - 1] = _low_bits(vocab_size % 32)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None) -> None:
    """Set the logits of disallowed tokens to -inf, in place.

    logits: float32/float16/bfloat16 [B, V], last dimension contiguous.
    bitmask: int32 [R, W], last dimension contiguous; any W (see the module docstring).
    indices: None (R == B, logits row i uses bitmask row i), or a 1-D int32/int64 tensor of R
      logits rows (logits row indices[k] uses bitmask row k; a row listed twice gets both
      masks). All three on the same device: CUDA runs the Triton kernel, CPU the torch path.
    """
    check_token_bitmask_args(logits, bitmask, indices)
    if logits.device.type == "cuda":
        _triton_module().apply_token_bitmask_triton(logits, bitmask, indices)
    elif logits.device.type == "cpu":
        _apply_cpu(logits, bitmask, indices)
    else:
        raise ValueError(f"apply_token_bitmask supports cuda and cpu tensors, got {logits.device}")


def mask_with_matchers(matchers: list, logits: torch.Tensor, timed: list | None = None) -> None:
    """Row i's tokens that matchers[i] forbids (None: no grammar) -> -inf, in place; with
    `timed` (requests, langrt.request.Req), the masks' time is counted on them (the dashboard's
    mask times)."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    words = (logits.shape[1] + 31) // 32
    bitmask = torch.empty((len(rows), words), dtype=torch.int32)
    for k, i in enumerate(rows):
        start = time.perf_counter()
        matchers[i].fill_bitmask(bitmask, k)
        if timed is not None:
            timed[i].grammar_mask_s += time.perf_counter() - start
            timed[i].grammar_masks += 1
    apply_token_bitmask(logits, bitmask.to(logits.device), torch.tensor(rows, device=logits.device))


def _low_bits(n: int) -> int:
    """An int32 value with the low `n` (1..31) bits set."""
    return (1 << n) - 1


@functools.cache
def _cap_table(dtype: torch.dtype) -> torch.Tensor:
    """[256, 8] table: entry (b, j) is +inf if bit j of byte b is set, else -inf.

    min(logit, cap) keeps an allowed logit and turns a disallowed one into -inf in one
    vectorized op: on 32 x 49,152 fp32 logits masked_fill_ with a bool mask took ~3 ms here,
    the lookup plus torch.minimum ~0.5 ms (2 threads).
    """
    bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return torch.where(bits.bool(), torch.tensor(float("inf")), torch.tensor(float("-inf"))).to(dtype)


def _caps(bitmask: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, vocab] caps (+inf allowed, -inf disallowed) for the first `vocab` tokens of each row.

    The int32 words are read as little-endian bytes, so byte 4w+i holds tokens 32w+8i..32w+8i+7
    in order and one table lookup per byte unpacks it.
    """
    caps = torch.embedding(_cap_table(dtype), bitmask.view(torch.uint8).long())
    caps = caps.view(*bitmask.shape[:-1], -1)
    return caps if caps.shape[-1] == vocab else caps[..., :vocab]


def _apply_cpu(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> None:
    """The CPU path: caps from a byte lookup table, then torch.minimum into the logits.

    A NaN logit stays NaN (torch.minimum propagates it); everything else matches masked_fill_.
    """
    vocab = logits.shape[1]
    covered = min(vocab, 32 * bitmask.shape[1])
    bitmask = bitmask[:, : words_for_vocab(covered)]  # words past the logits are ignored
    if bitmask.shape[0] == 0 or vocab == 0:
        return
    if bitmask.shape[0] == 1:
        _apply_one_row(logits[0 if indices is None else int(indices[0])], bitmask[0], covered)
    elif indices is None:
        _apply_rows(logits, bitmask, covered)
    else:
        _apply_indexed(logits, bitmask, indices.long(), covered)


def _apply_one_row(row: torch.Tensor, words: torch.Tensor, covered: int) -> None:
    """One row (a lone constrained request decoding): 1-D ops, no chunking (~8 us less)."""
    if covered < row.shape[0]:
        row[covered:].fill_(float("-inf"))
        row = row[:covered]
    if covered:
        torch.minimum(row, _caps(words, covered, row.dtype), out=row)


def _apply_rows(logits: torch.Tensor, bitmask: torch.Tensor, covered: int) -> None:
    """logits row i uses bitmask row i, a chunk of rows at a time."""
    if covered < logits.shape[1]:
        logits[:, covered:].fill_(float("-inf"))
    if covered == 0:
        return
    step = max(1, _CPU_CHUNK_ELEMENTS // logits.shape[1])
    for start in range(0, logits.shape[0], step):
        rows = logits[start : start + step, :covered]
        torch.minimum(rows, _caps(bitmask[start : start + step], covered, logits.dtype), out=rows)


def _apply_indexed(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor, covered: int) -> None:
    """logits row indices[k] uses bitmask row k; a repeated row takes the min of all its caps."""
    if covered < logits.shape[1]:
        logits[:, covered:].index_fill_(0, indices, float("-inf"))
    if covered == 0:
        return
    step = max(1, _CPU_CHUNK_ELEMENTS // logits.shape[1])
    target = logits[:, :covered]
    with warnings.catch_warnings():
        # index_reduce_ is marked beta; it is torch's one vectorized in-place row min by index.
        warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta", category=UserWarning)
        for start in range(0, indices.shape[0], step):
            caps = _caps(bitmask[start : start + step], covered, logits.dtype)
            target.index_reduce_(0, indices[start : start + step], caps, "amin")


def _triton_module():
    import langrt_kernels.grammar_bitmask

    return langrt_kernels.grammar_bitmask
