"""What token masks cost a decode batch: 16 JSON-schema requests decoded together, with their
grammar vs the same requests unconstrained, token for token (built-in model, greedy).

Each round takes fresh documents (bench_json.py's extraction workload) and runs them three
times on two engines with jump-forward off (so a pass is one token per request on every side),
in an order that rotates each round:

- constrained: the schema, until each output's grammar ends it, masks computed on a thread
  during each forward pass (the default);
- constrained without prefetch (`disable_mask_prefetch=True`, a second engine): masks computed
  after each pass, on the scheduler's critical path;
- unconstrained: no grammar, each request held to the number of tokens its constrained run
  produced (`ignore_eos`, `max_new_tokens` = that count), so every side runs the same passes
  over the same batch, and the difference is the masks: filling them, applying them, advancing
  the matchers.

The prefix cache is flushed before every run. A warm-up (the schema compiled, its states' masks
computed once) comes before the timed rounds: this measures a served schema's steady state; a
new schema's first masks are what bench_maskbench.py measures. Reports seconds per pass on each
side and the constrained sides' ratios to the unconstrained one (median of the rounds).

    .venv/bin/python benchmarks/bench_mask_overhead.py [--batch 16] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import langrt
from bench_json import SCHEMA, documents
from results_meta import write_results

RESULTS = Path(__file__).parent / "results"


def prompts_for(tokenizer, n: int, seed: int) -> list[str]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Extract the person's details as JSON.\n\n{doc}"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for doc in documents(n, seed=seed)
    ]


def run(engine, prompts: list[str], params) -> dict:
    engine.flush_cache()
    before = engine.cache_stats()
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    passes = engine.cache_stats()["forward_passes"] - before["forward_passes"]
    tokens = [o["meta_info"]["completion_tokens"] for o in outs]
    return {"seconds": seconds, "forward_passes": passes, "tokens": tokens, "s_per_pass": seconds / passes}


def one_round(engines: dict, prompts: list[str], max_tokens: int, shift: int) -> dict:
    """One untimed constrained run counts each request's tokens; then the three sides, timed,
    in an order that rotates with `shift`."""
    constrained = {"json_schema": SCHEMA, "max_new_tokens": max_tokens, "temperature": 0}
    counts = run(engines["prefetch"], prompts, constrained)["tokens"]
    free = [{"max_new_tokens": n, "ignore_eos": True, "temperature": 0} for n in counts]
    sides = [
        ("constrained", engines["prefetch"], constrained),
        ("constrained_no_prefetch", engines["no_prefetch"], constrained),
        ("unconstrained", engines["prefetch"], free),
    ]
    sides = sides[shift % 3 :] + sides[: shift % 3]
    timed = {side: run(engine, prompts, params) for side, engine, params in sides}
    assert all(t["tokens"] == counts for t in timed.values()), "the sides produced different token counts"
    base = timed["unconstrained"]["s_per_pass"]
    return {
        **timed,
        "ratio_s_per_pass": timed["constrained"]["s_per_pass"] / base,
        "ratio_s_per_pass_no_prefetch": timed["constrained_no_prefetch"]["s_per_pass"] / base,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 4 requests")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.rounds = 4, 2
    out = Path(args.out) if args.out else RESULTS / f"bench_mask_overhead{'_quick' if args.quick else ''}.json"
    common = dict(log_level="warning", max_total_tokens=32768, disable_jump_forward=True)
    with (
        langrt.Engine(**common) as on,
        langrt.Engine(**common, disable_mask_prefetch=True) as off,
    ):
        engines = {"prefetch": on, "no_prefetch": off}
        warm = prompts_for(on.tokenizer, args.batch, seed=1000)
        for engine in engines.values():
            engine.generate(warm, {"json_schema": SCHEMA, "max_new_tokens": args.max_tokens, "temperature": 0})
        rounds = []
        for r in range(args.rounds):
            rounds.append(one_round(engines, prompts_for(on.tokenizer, args.batch, seed=r), args.max_tokens, r))
            row = rounds[-1]
            print(
                f"round {r}: {row['constrained']['forward_passes']} passes; ms/pass constrained "
                f"{row['constrained']['s_per_pass'] * 1e3:.1f}, without prefetch "
                f"{row['constrained_no_prefetch']['s_per_pass'] * 1e3:.1f}, unconstrained "
                f"{row['unconstrained']['s_per_pass'] * 1e3:.1f}",
                flush=True,
            )
    median = statistics.median
    results = {
        "batch": args.batch,
        "max_new_tokens": args.max_tokens,
        "rounds": rounds,
        "median_ratio_s_per_pass": median(r["ratio_s_per_pass"] for r in rounds),
        "median_ratio_s_per_pass_no_prefetch": median(r["ratio_s_per_pass_no_prefetch"] for r in rounds),
        "median_ms_per_pass": {
            side: 1e3 * median(r[side]["s_per_pass"] for r in rounds)
            for side in ("constrained", "constrained_no_prefetch", "unconstrained")
        },
    }
    print(
        "seconds per pass, constrained / unconstrained (median): "
        f"{results['median_ratio_s_per_pass']:.3f} with prefetch, "
        f"{results['median_ratio_s_per_pass_no_prefetch']:.3f} without"
    )
    write_results(out, results)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
