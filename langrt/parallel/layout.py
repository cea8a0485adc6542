"""Which part of the model each tensor-parallel rank holds (`--tp-size N`).

Attention is split by heads, the MLP by its intermediate rows, the embedding and LM head by
vocabulary rows; norms are replicated. Splits need not be even: SmolLM2's 9 query heads over 3
KV heads go 6 + 3 over two ranks (two KV groups and one). Where there are fewer KV heads than
ranks, the query heads are split and each rank holds the KV heads its query heads read, so a KV
head may live on several ranks (replicated, as SGLang does). A rank's query head i reads its
KV head i // (query heads / KV heads), as in an unsplit model; where a rank's query heads would
break that (a split through a KV group of another size), it holds one KV head per query head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from langrt.model.config import ModelConfig

# The quantized kernels' block: the MLP's intermediate rows are split in multiples of it where
# they can be, so a row-parallel down projection's input columns are whole blocks.
BLOCK = 32


def split(n: int, parts: int, index: int, unit: int = 1) -> tuple[int, int]:
    """[start, end) of part `index` of n items split into `parts` contiguous ranges, as even
    as whole `unit`s allow (earlier parts take the remainder)."""
    if n % unit or n // unit < parts:
        unit = 1
    if n < parts:
        raise ValueError(f"{n} items cannot be split over {parts} ranks")
    units, extra = divmod(n // unit, parts)
    start = index * units + min(index, extra)
    return start * unit, (start + units + (index < extra)) * unit


def head_split(num_heads: int, num_kv_heads: int, size: int, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global query heads, global KV heads) of `rank`; KV heads may repeat (one per query head)."""
    group = num_heads // num_kv_heads
    if num_kv_heads >= size:
        kv0, kv1 = split(num_kv_heads, size, rank)
        return tuple(range(kv0 * group, kv1 * group)), tuple(range(kv0, kv1))
    q0, q1 = split(num_heads, size, rank)
    reads = [h // group for h in range(q0, q1)]
    distinct = sorted(set(reads))
    per_kv = len(reads) // len(distinct)
    if len(reads) % len(distinct) == 0 and all(kv == distinct[i // per_kv] for i, kv in enumerate(reads)):
        return tuple(range(q0, q1)), tuple(distinct)
    return tuple(range(q0, q1)), tuple(reads)


@dataclass(frozen=True)
class ShardLayout:
    rank: int
    size: int
    q_heads: tuple[int, ...]  # contiguous
    kv_heads: tuple[int, ...]  # local KV head j is global KV head kv_heads[j]
    ffn: tuple[int, int]  # [start, end) of the intermediate rows
    vocab: tuple[int, int]  # [start, end) of the vocabulary
    vocab_per_rank: tuple[int, ...]  # every rank's vocabulary rows, in rank order

    @classmethod
    def create(cls, config: ModelConfig, rank: int, size: int) -> "ShardLayout":
        if config.num_heads < size:
            raise ValueError(f"--tp-size {size}: the model has only {config.num_heads} attention heads")
        q_heads, kv_heads = head_split(config.num_heads, config.num_kv_heads, size, rank)
        vocab = [split(config.vocab_size, size, r) for r in range(size)]
        return cls(
            rank,
            size,
            q_heads,
            kv_heads,
            split(config.intermediate_size, size, rank, BLOCK),
            vocab[rank],
            tuple(end - start for start, end in vocab),
        )

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The config of this rank's part: its heads, intermediate rows and vocabulary rows."""
        return dataclasses.replace(
            config,
            num_heads=len(self.q_heads),
            num_kv_heads=len(self.kv_heads),
            intermediate_size=self.ffn[1] - self.ffn[0],
            vocab_size=self.vocab[1] - self.vocab[0],
        )

    def kv_heads_in_memory(self, config: ModelConfig, shared_memory: bool) -> int:
        """KV heads per token that one memory holds: this rank's, or every rank's where the
        ranks share one memory (CPU processes on one machine)."""
        if not shared_memory:
            return len(self.kv_heads)
        return sum(len(ShardLayout.create(config, r, self.size).kv_heads) for r in range(self.size))
