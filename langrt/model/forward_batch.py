"""ForwardBatch: what one model forward pass needs to know about its requests.

Layout of a batch of B requests: request i contributes `extend_lens[i]` new tokens, which sit at
positions `[prefix_lens[i], seq_lens[i])` of its sequence. The new tokens of all requests are
concatenated request-major into `input_ids` / `positions` / `out_cache_loc` ([T] each). Request
i's K/V for every position lives in the slots `req_to_token[req_pool_indices[i], :seq_lens[i]]`;
the first `prefix_lens[i]` of those are already written (a cached prefix or earlier steps), the
rest are `out_cache_loc`'s share for request i and are written during this pass.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill, possibly on top of a cached prefix
    DECODE = "decode"  # one new token per request


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64
    req_pool_indices: list[int]  # [B]
    seq_lens: list[int]  # [B] total length after this pass
    extend_lens: list[int]  # [B] new tokens in this pass
    extend_starts: list[int] = field(init=False)  # [B] offset of request i's first new token
    # Every row is a running request's next token or one of its drafts (no prompt rows), though
    # with drafts the mode is EXTEND: such passes may take other kernels than prompts (see quant).
    decoding: bool = False
    # [B] each request's LoRA adapter (langrt.lora.LoraAdapter, None: the base model); None when
    # no request in the pass has one (the plain model runs)
    adapters: list | None = None

    def __post_init__(self):
        n = len(self.req_pool_indices)
        assert len(self.seq_lens) == n and len(self.extend_lens) == n, "ragged batch description"
        assert all(0 < e <= s for e, s in zip(self.extend_lens, self.seq_lens)), "each request extends by >= 1"
        assert self.input_ids.numel() == sum(self.extend_lens) == self.out_cache_loc.numel()
        assert self.adapters is None or len(self.adapters) == n, "one adapter entry per request"
        if self.mode is ForwardMode.DECODE:
            assert all(e == 1 for e in self.extend_lens), "decode adds one token per request"
        self.extend_starts = list(itertools.accumulate(self.extend_lens, initial=0))[:-1]

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def prefix_lens(self) -> list[int]:
        return [s - e for s, e in zip(self.seq_lens, self.extend_lens)]

    @property
    def last_token_rows(self) -> list[int]:
        """Row of each request's last new token in the [T] layout."""
        return [start + n - 1 for start, n in zip(self.extend_starts, self.extend_lens)]

    @classmethod
    def build(
        cls,
        mode: ForwardMode,
        input_ids: list[int],
        out_cache_loc: torch.Tensor,
        req_pool_indices: list[int],
        seq_lens: list[int],
        extend_lens: list[int],
        device: torch.device,
        decoding: bool = False,
        adapters: list | None = None,
    ) -> "ForwardBatch":
        """Positions follow from the lengths: request i's new tokens are at prefix..seq_len-1."""
        positions = [p for s, e in zip(seq_lens, extend_lens) for p in range(s - e, s)]
        return cls(
            mode=mode,
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            out_cache_loc=out_cache_loc.to(device),
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            extend_lens=extend_lens,
            decoding=decoding or mode is ForwardMode.DECODE,
            adapters=adapters,
        )
