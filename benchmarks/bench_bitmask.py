"""CPU time per call of applying a token bitmask to logits (the CPU serving path).

Each shape is timed on random masks (rows half allowed) for the serving path
(`langrt.constrained.bitmask.apply_token_bitmask`), the same with `indices` listing every row
in reverse order, and the plain masked_fill_ reference for comparison. Logits are restored from
a copy outside the timed region.

    .venv/bin/python benchmarks/bench_bitmask.py [--threads N] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from langrt.constrained.bitmask import apply_token_bitmask, words_for_vocab

SHAPES = [(1, 49152), (32, 49152), (32, 151936)]


def time_call(fn, logits: torch.Tensor, repeats: int) -> tuple[float, float]:
    """(median, best) seconds per call over `repeats` calls, each on fresh logits.

    The best is the steadier figure on a machine shared with other work (2 cores, say).
    """
    original = logits.clone()
    fn()  # warm up (lookup tables, allocator)
    samples = []
    for _ in range(repeats):
        logits.copy_(original)
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), min(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from langrt_kernels.grammar_bitmask import apply_token_bitmask_reference

    dtype = getattr(torch, args.dtype)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype} logits; ms per call, median / best"
    )
    print(f"{'shape':>14} {'apply':>15} {'indices':>15} {'reference':>15}")
    for rows, vocab in SHAPES:
        logits = torch.randn(rows, vocab).to(dtype)
        bitmask = torch.randint(-(2**31), 2**31, (rows, words_for_vocab(vocab)), dtype=torch.int32)
        indices = torch.arange(rows - 1, -1, -1)
        calls = [
            (functools.partial(apply_token_bitmask, logits, bitmask), args.repeats),
            (functools.partial(apply_token_bitmask, logits, bitmask, indices), args.repeats),
            (functools.partial(apply_token_bitmask_reference, logits, bitmask), max(5, args.repeats // 5)),
        ]
        cells = " ".join(
            f"{median * 1e3:7.3f}/{best * 1e3:7.3f}" for median, best in (time_call(fn, logits, n) for fn, n in calls)
        )
        print(f"{[rows, vocab]!s:>14} {cells}")


if __name__ == "__main__":
    main()
