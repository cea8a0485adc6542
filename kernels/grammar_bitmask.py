"""Apply a packed token bitmask to logits: disallowed tokens' logits become -inf, in place.

Mask layout and padded-vocab rules are those of `langrt.constrained.bitmask` (bit j of int32
word w allows token 32*w + j; bits past the logits' width are ignored; logits columns past the
mask's 32 * words are disallowed). `indices`, when given, lists the logits rows to touch:
logits row indices[k] uses bitmask row k, and a row listed twice gets both masks.

`apply_token_bitmask_triton` runs the kernel on CUDA tensors, or on CPU tensors when triton was
imported with TRITON_INTERPRET=1 (the interpreter, for tests). `apply_token_bitmask_reference`
is the plain torch definition the kernel is tested against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from langrt_kernels.bitmask_args import check_token_bitmask_args

# Logits per program: enough to amortize the index load, few enough that a 152k vocab still
# spreads over ~38 programs per row.
_MAX_BLOCK = 4096


@triton.jit
def _apply_token_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    indices_ptr,
    vocab_size,
    mask_words,
    logits_row_stride,
    bitmask_row_stride,
    HAS_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Program (k, b): bitmask row k, logits columns [b * BLOCK, (b + 1) * BLOCK).
    k = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    if HAS_INDICES:
        row = tl.load(indices_ptr + k).to(tl.int64)
    else:
        row = k
    words = block * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    # Words past the mask read as 0: columns it does not cover are disallowed.
    packed = tl.load(bitmask_ptr + k * bitmask_row_stride + words, mask=words < mask_words, other=0)
    banned = ((packed[:, None] >> tl.arange(0, 32)[None, :]) & 1) == 0
    banned = tl.reshape(banned, (BLOCK,))  # row-major: element (w, j) is column 32 * w + j
    cols = block * BLOCK + tl.arange(0, BLOCK)
    neg_inf = tl.full((BLOCK,), float("-inf"), logits_ptr.dtype.element_ty)
    # Store-only: allowed logits are never read or written, and a row listed twice in
    # `indices` ends up with the union of both masks' bans whatever the program order.
    tl.store(logits_ptr + row * logits_row_stride + cols, neg_inf, mask=banned & (cols < vocab_size))


def apply_token_bitmask_triton(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Set the logits of tokens `bitmask` disallows to -inf, in place, with the Triton kernel.

    logits: float32/float16/bfloat16 [B, V], last dimension contiguous (rows may be strided).
    bitmask: int32 [R, W], last dimension contiguous; R == B without indices.
    indices: optional 1-D int32/int64 tensor of R logits rows (one device sync checks bounds).
    """
    check_token_bitmask_args(logits, bitmask, indices)
    _check_device(logits)
    rows, vocab = bitmask.shape[0], logits.shape[1]
    if rows == 0 or vocab == 0:
        return
    if bitmask.shape[1] == 0:  # a mask covering no token bans every column (and has no storage)
        if indices is None:
            logits.fill_(float("-inf"))
        else:
            logits.index_fill_(0, indices.long(), float("-inf"))
        return
    block = max(32, min(_MAX_BLOCK, triton.next_power_of_2(vocab)))
    grid = (rows, triton.cdiv(vocab, block))
    _apply_token_bitmask_kernel[grid](
        logits,
        bitmask,
        indices if indices is not None else bitmask,  # unused without HAS_INDICES
        vocab,
        bitmask.shape[1],
        logits.stride(0),
        bitmask.stride(0),
        HAS_INDICES=indices is not None,
        BLOCK=block,
    )


def apply_token_bitmask_reference(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """The definition, in plain torch: unpack each mask row to bools and masked_fill_ in place."""
    check_token_bitmask_args(logits, bitmask, indices)
    vocab = logits.shape[1]
    rows = range(bitmask.shape[0]) if indices is None else indices.tolist()
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    for k, row in enumerate(rows):
        allowed = ((bitmask[k].unsqueeze(1) >> shifts) & 1).bool().flatten()
        if allowed.numel() < vocab:  # columns past the mask's coverage are disallowed
            allowed = torch.cat([allowed, allowed.new_zeros(vocab - allowed.numel())])
        logits[row].masked_fill_(~allowed[:vocab], float("-inf"))


def is_interpreted() -> bool:
    """Whether the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 at import): CPU tensors."""
    return isinstance(_apply_token_bitmask_kernel, InterpretedFunction)


def _check_device(logits: torch.Tensor) -> None:
    if is_interpreted() and logits.device.type != "cpu":
        raise ValueError(
            f"the Triton interpreter (TRITON_INTERPRET=1) runs on CPU tensors, got {logits.device}; "
            "unset TRITON_INTERPRET to run on the GPU"
        )
    if not is_interpreted() and logits.device.type != "cuda":
        raise ValueError(
            f"apply_token_bitmask_triton needs CUDA tensors, got {logits.device}; use "
            "langrt.constrained.bitmask.apply_token_bitmask on CPU (or TRITON_INTERPRET=1 to test the kernel there)"
        )
