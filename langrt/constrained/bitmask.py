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
import warnings

import torch

LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)

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
        raise ValueError(f"allocate_token_bitmask needs batch >= 0 and vocab_size >= 1, got batch={batch}, vocab_size={vocab_size}")
    bitmask = torch.full((batch, words_for_vocab(vocab_size)), -1, dtype=torch.int32, device=device)
    if vocab_size % 32:
        bitmask[:, -1] = _low_bits(vocab_size % 32)
    return bitmask


def fill_all(bitmask: torch.Tensor, row: int, vocab_size: int | None = None) -> None:
    """Allow every token in row `row` of `bitmask` (an unconstrained request in a mixed batch).

    With `vocab_size`, only ids below it are allowed (the tail bits are cleared, as in
    `allocate_token_bitmask`); without it, every bit of the row is set.
    """
    _check_bitmask(bitmask, "bitmask")
    if not 0 <= row < bitmask.shape[0]:
        raise IndexError(f"fill_all: row {row} is outside the bitmask's {bitmask.shape[0]} rows")
    bitmask[row].fill_(-1)
    if vocab_size is not None:
        words = words_for_vocab(vocab_size)
        if words > bitmask.shape[1]:
            raise ValueError(f"fill_all: vocab_size {vocab_size} needs {words} words, the bitmask has {bitmask.shape[1]}")
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


def check_token_bitmask_args(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> None:
    """Raise a ValueError/TypeError naming what is wrong with the arguments of an apply call.

    Checks dtypes, ranks, row counts, strides, devices and (one device sync when `indices` is
    on a GPU) that every index is a row of `logits`. Shared by the CPU path and the Triton
    launcher, which adds its own device rule.
    """
    if not isinstance(logits, torch.Tensor) or logits.dtype not in LOGITS_DTYPES:
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a float32, float16 or bfloat16 tensor, got {got}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [batch, vocab], got shape {tuple(logits.shape)}")
    if logits.shape[1] > 1 and logits.stride(1) != 1:
        raise ValueError(
            f"logits must be contiguous along the vocab dimension (stride {logits.stride(1)}); they are written in "
            "place, so a .contiguous() copy would not do: produce them contiguous"
        )
    _check_bitmask(bitmask, "bitmask")
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask is on {bitmask.device} but logits are on {logits.device}; move the bitmask with .to(logits.device)")
    if indices is None:
        if bitmask.shape[0] != logits.shape[0]:
            raise ValueError(
                f"bitmask has {bitmask.shape[0]} rows but logits have {logits.shape[0]}; without indices they must "
                f"match (pass bitmask[:{logits.shape[0]}] for a larger buffer)"
            )
        return
    _check_indices(indices, logits, bitmask)


def _check_bitmask(bitmask: torch.Tensor, name: str) -> None:
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
        got = bitmask.dtype if isinstance(bitmask, torch.Tensor) else type(bitmask).__name__
        raise TypeError(f"{name} must be an int32 tensor (32 tokens per word), got {got}")
    if bitmask.dim() != 2:
        raise ValueError(f"{name} must be 2-D [batch, ceil(vocab/32)], got shape {tuple(bitmask.shape)}")
    if bitmask.shape[1] > 1 and bitmask.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous along its word dimension (stride {bitmask.stride(1)}); pass {name}.contiguous()")


def _check_indices(indices: torch.Tensor, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    if not isinstance(indices, torch.Tensor) or indices.dtype not in INDEX_DTYPES:
        got = indices.dtype if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise TypeError(f"indices must be an int32 or int64 tensor of logits rows, got {got}")
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    if indices.device != logits.device:
        raise ValueError(f"indices are on {indices.device} but logits are on {logits.device}; move them with .to(logits.device)")
    if indices.shape[0] != bitmask.shape[0]:
        raise ValueError(
            f"bitmask has {bitmask.shape[0]} rows but indices has {indices.shape[0]} entries; bitmask row k applies "
            "to logits row indices[k], so they must match"
        )
    if indices.numel():
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= logits.shape[0]:
            bad = low if low < 0 else high
            raise ValueError(f"indices must be rows of logits (0 <= i < {logits.shape[0]}), got {bad}")


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

    return kernels.grammar_bitmask
