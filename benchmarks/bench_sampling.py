"""The sampler's draw for unseeded rows, side by side: langrt's exponential race with E = -log U
(uniform_ and one vectorized log, one draw for the batch) against the same race with torch's
exponential_ (the draw before 2026-11-26; seeded rows keep it, so a seed gives the tokens it
gave before), on [B, 49152] rows (the built-in model's vocabulary). Also checks that both pick
tokens at the rates the probabilities say, on a small vocabulary.

    .venv/bin/python benchmarks/bench_sampling.py [--threads 2] [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from langrt.sampling.sampler import race
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
VOCAB = 49152


def race_exponential(probs: torch.Tensor, generators: list) -> torch.Tensor:
    """The race as it was drawn before: exponential_ per seeded row, or for the whole batch."""
    noise = torch.empty_like(probs)
    noise.exponential_() if any(g is None for g in generators) else noise.fill_(1.0)
    for row, gen in enumerate(generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    return (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).max(dim=-1).indices


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[reps // 2] * 1e3


def frequency_error(draw, generators: list, n: int = 20000) -> float:
    """Largest |observed - expected| pick rate over 8 tokens of known probabilities."""
    p = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
    picks = torch.cat([draw(p.expand(len(generators), -1).clone(), generators) for _ in range(n // len(generators))])
    return float((torch.bincount(picks, minlength=8).float() / len(picks) - p).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1 and 8 rows, fewer repeats and draws")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for batch in (1, 8) if args.quick else (1, 8, 32):
        probs = torch.rand(batch, VOCAB).softmax(dim=-1)
        gens = [None] * batch
        ms = {name: median_ms(lambda: draw(probs, gens), 5 if args.quick else 51 if batch < 32 else 21) for name, draw in
              (("uniform_log", race), ("exponential", race_exponential))}  # fmt: skip
        rows.append({"rows": batch, "ms": ms, "speedup": ms["exponential"] / ms["uniform_log"]})
        print(
            f"{batch:2d} rows: -log U {ms['uniform_log']:.3f} ms, exponential_ {ms['exponential']:.3f} ms ({rows[-1]['speedup']:.2f}x)"
        )
    draws = 4000 if args.quick else 20000
    errors = {
        name: frequency_error(draw, [None] * 4, draws)
        for name, draw in (("uniform_log", race), ("exponential", race_exponential))
    }
    print(f"largest pick-rate error over {draws:,} draws (standard error ~{0.46 / draws**0.5:.3f}): {errors}")
    out = RESULTS / f"bench_sampling{'_quick' if args.quick else ''}.json"
    write_results(out, {"threads": args.threads, "vocab": VOCAB, "rows": rows, "pick_rate_error": errors})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
