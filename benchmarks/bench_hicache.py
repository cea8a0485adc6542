"""HiCache (--hicache-size, --hicache-dir): time to first token when prefixes return after the
radix cache evicted them, with the tiers and without.

Workload: `--prefixes` distinct prefixes of `--prefix-tokens` tokens (together 4x the KV pool,
`--pool-ratio`), each followed by a short suffix. A first visit computes every prefix once
(the pool keeps only the last quarter of them); then `--returns` rounds revisit every prefix
with a new suffix, one request at a time. Without tiers a returning prefix is computed again;
with them it loads from host memory (or disk). Sides, each its own in-process scheduler over
the built-in model, run request by request side by side (A, B, C, A, B, C, ...):

    no_tiers     radix cache only, same pool
    host         --hicache-size
    host_disk    --hicache-size and --hicache-dir (write-through)
    restarted    then a new scheduler over host_disk's directory (empty host tier), beside
                 no_tiers: its returning prefixes load from disk

Every side's outputs must equal no_tiers' (greedy). Reported: median and mean TTFT of the
returning requests per side, the ratio to no_tiers (target: at least 2x lower), and each side's
prompt hit rate on them (cached prompt tokens / prompt tokens) with the tokens from each tier.

    .venv/bin/python benchmarks/bench_hicache.py [--prefixes 8] [--prefix-tokens 512] [--returns 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from runner_driver import make_scheduler  # noqa: E402
from results_meta import write_results  # noqa: E402

from langrt.builtin import builtin_model_path  # noqa: E402
from langrt.mem.pools import TokenToKVPool  # noqa: E402
from langrt.request import Req  # noqa: E402
from langrt.sampling.sampling_params import SamplingParams  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SUFFIX_TOKENS, NEW_TOKENS = 16, 8


def tokens(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, 49000, (n,), generator=gen).tolist()


def serve(scheduler, ids: list[int]) -> tuple[float, list[int]]:
    """One request alone: (seconds to its first token, its output ids)."""
    req = Req(
        f"r{time.monotonic_ns()}", ids, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    )
    start = time.perf_counter()
    scheduler.add_request(req)
    while not req.output_ids:
        scheduler.step()
    ttft = time.perf_counter() - start
    while scheduler.has_work:
        scheduler.step()
    return ttft, list(req.output_ids)


def tier_counts(scheduler) -> dict:
    s = scheduler.cache_stats()
    keys = ("prompt_tokens", "cached_prompt_tokens", "hicache_host_hit_tokens", "hicache_disk_hit_tokens")
    return {k: s.get(k, 0) for k in keys}


def phase(schedulers: dict, prompts: list[list[int]]) -> dict[str, dict]:
    """Every prompt through every side, side by side; per side its TTFTs, outputs and counters."""
    before = {name: tier_counts(s) for name, s in schedulers.items()}
    out = {name: {"ttft_s": [], "outputs": []} for name in schedulers}
    for ids in prompts:
        for name, scheduler in schedulers.items():
            ttft, output = serve(scheduler, ids)
            out[name]["ttft_s"].append(ttft)
            out[name]["outputs"].append(output)
    for name, scheduler in schedulers.items():
        after = tier_counts(scheduler)
        out[name]["counts"] = {k: after[k] - before[name][k] for k in after}
    return out


def summary(side: dict) -> dict:
    c = side["counts"]
    return {
        "ttft_median_s": statistics.median(side["ttft_s"]),
        "ttft_mean_s": statistics.mean(side["ttft_s"]),
        "prompt_hit_rate": c["cached_prompt_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0,
        "host_hit_tokens": c["hicache_host_hit_tokens"],
        "disk_hit_tokens": c["hicache_disk_hit_tokens"],
        "ttft_s": side["ttft_s"],
    }


def run(args, disk_dir: str) -> dict:
    pool = args.prefixes * args.prefix_tokens // args.pool_ratio
    common = dict(dtype=args.dtype, max_total_tokens=pool, context_length=args.prefix_tokens + 64)
    no_tiers = make_scheduler(builtin_model_path(), **common)
    # room for every prefix twice over: the host tier itself never evicts here
    host_gb = 2 * args.prefixes * (args.prefix_tokens + 64) * kv_bytes_per_token(no_tiers) / (1 << 30)
    sides = {
        "no_tiers": no_tiers,
        "host": make_scheduler(builtin_model_path(), hicache_size=host_gb, **common),
        "host_disk": make_scheduler(builtin_model_path(), hicache_size=host_gb, hicache_dir=disk_dir, **common),
    }
    prefixes = [tokens(i, args.prefix_tokens) for i in range(args.prefixes)]
    visit = lambda r: [p + tokens(10_000 * (r + 1) + i, SUFFIX_TOKENS) for i, p in enumerate(prefixes)]  # noqa: E731
    phase(sides, [tokens(99, 64)])  # warm-up: first-pass allocations, nothing shared
    first = phase(sides, visit(0))
    returns = [phase(sides, visit(r)) for r in range(1, args.returns + 1)]
    del sides["host"], sides["host_disk"]  # no_tiers stays: the restarted side's baseline, side by side
    restarted = {
        "no_tiers": no_tiers,
        "restarted": make_scheduler(builtin_model_path(), hicache_size=host_gb, hicache_dir=disk_dir, **common),
    }
    phase(restarted, [tokens(98, 64)])  # its own warm-up, on a prompt no side has seen
    after_restart = phase(restarted, visit(args.returns))
    return {"first": first, "returns": returns, "after_restart": after_restart, "pool_tokens": pool, "host_gb": host_gb}


def kv_bytes_per_token(scheduler) -> int:
    c = scheduler.runner.config
    return TokenToKVPool.bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, scheduler.runner.dtype)


def merged(phases: list[dict], name: str) -> dict:
    """One side's TTFTs and counters over several phases."""
    sides = [p[name] for p in phases]
    counts = {k: sum(s["counts"][k] for s in sides) for k in sides[0]["counts"]}
    return {"ttft_s": [t for s in sides for t in s["ttft_s"]], "counts": counts}


def identical_outputs(result: dict) -> dict[str, bool]:
    """Each side's outputs against no_tiers' on the same prompts."""
    checks = {}
    for label, p in [("first", result["first"])] + [(f"return{i + 1}", r) for i, r in enumerate(result["returns"])]:
        for name in ("host", "host_disk"):
            checks[f"{label}/{name}"] = p[name]["outputs"] == p["no_tiers"]["outputs"]
    after = result["after_restart"]
    checks["after_restart/restarted"] = after["restarted"]["outputs"] == after["no_tiers"]["outputs"]
    return checks


def report(result: dict, args) -> dict:
    returning = {name: summary(merged(result["returns"], name)) for name in ("no_tiers", "host", "host_disk")}
    returning["restarted"] = summary(result["after_restart"]["restarted"])
    returning["no_tiers_beside_restarted"] = summary(result["after_restart"]["no_tiers"])
    lower = {
        name: returning["no_tiers"]["ttft_median_s"] / returning[name]["ttft_median_s"]
        for name in ("host", "host_disk")
    }
    lower["restarted"] = (
        returning["no_tiers_beside_restarted"]["ttft_median_s"] / returning["restarted"]["ttft_median_s"]
    )
    first = {name: summary(side) for name, side in result["first"].items()}
    return {
        "benchmark": "bench_hicache",
        "settings": {
            "model": "built-in (SmolLM2-135M-Instruct)",
            "dtype": args.dtype,
            "prefixes": args.prefixes,
            "prefix_tokens": args.prefix_tokens,
            "suffix_tokens": SUFFIX_TOKENS,
            "new_tokens": NEW_TOKENS,
            "returns": args.returns,
            "pool_tokens": result["pool_tokens"],
            "host_tier_gb": result["host_gb"],
            "prefixes_over_pool": args.prefixes * args.prefix_tokens / result["pool_tokens"],
        },  # fmt: skip
        "returning": returning,
        "first_visit": first,
        "ttft_lower_x_vs_no_tiers": lower,  # medians; each side against no_tiers run beside it
        "target_ttft_lower_x": 2.0,
        "first_restarted_request": {
            "ttft_s": returning["restarted"]["ttft_s"][0],
            "disk_hit": result["after_restart"]["restarted"]["counts"]["hicache_disk_hit_tokens"] > 0,
        },
        "outputs_identical": identical_outputs(result),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixes", type=int, default=8)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--pool-ratio", type=int, default=4, help="the prefixes' tokens over the KV pool's")
    parser.add_argument("--returns", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=str(RESULTS / "bench_hicache.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as disk_dir:
        result = run(args, disk_dir)
    out = report(result, args)
    write_results(Path(args.out), out, dtype=args.dtype)
    brief = {k: out[k] for k in ("ttft_lower_x_vs_no_tiers", "first_restarted_request", "outputs_identical")}
    brief["returning"] = {n: {k: v for k, v in r.items() if k != "ttft_s"} for n, r in out["returning"].items()}
    print(json.dumps(brief, indent=2))
    if not all(out["outputs_identical"].values()):
        sys.exit("outputs differ between sides (see outputs_identical)")


if __name__ == "__main__":
    main()
