"""Throughput of many LoRA adapters in one batch (langrt/lora/): 16 requests spread over 4
adapters in one batch, against the same 16 requests with no adapter (the target: at least 0.8x
its throughput) and against the adapters served one after another (4 batches of 4 requests,
one adapter each: what a server holding one adapter at a time could do).

The adapters are written by peft onto the built-in model (rank 8 on q/k/v/o/gate/up/down, random
non-zero factors), into a temporary directory. Each side runs in-process through the scheduler
(prefill, then decode to `--new-tokens` with ignore_eos), radix cache off so no side reuses
another's prompts; rounds alternate the three sides and the median round is reported.

    .venv/bin/python benchmarks/bench_lora.py [--rounds 3] [--new-tokens 32] [--dtype float32]
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
from lora_utils import write_adapter  # noqa: E402
from runner_driver import make_scheduler  # noqa: E402
from results_meta import write_results  # noqa: E402

from langrt.builtin import builtin_model_path  # noqa: E402
from langrt.messages import RequestOptions  # noqa: E402
from langrt.sampling.sampling_params import SamplingParams  # noqa: E402
from langrt.request import Req  # noqa: E402

RESULTS = Path(__file__).parent / "results"
ADAPTERS, REQUESTS = 4, 16


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(100, 49000, (length,), generator=gen).tolist() for _ in range(n)]


def run_batch(scheduler, ids: list[list[int]], loras: list[str | None], new_tokens: int) -> float:
    """Seconds to run these requests to the end, all admitted at once."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    reqs = [
        Req(f"r{i}-{time.monotonic_ns()}", p, params, RequestOptions(lora_path=name))
        for i, (p, name) in enumerate(zip(ids, loras))
    ]
    start = time.perf_counter()
    for req in reqs:
        scheduler.add_request(req)
    while scheduler.has_work:
        scheduler.step()
    elapsed = time.perf_counter() - start
    assert all(len(r.output_ids) == new_tokens for r in reqs)
    return elapsed


def sides(scheduler, ids, names, new_tokens) -> dict[str, float]:
    """One round: seconds of each side."""
    spread = [names[i % ADAPTERS] for i in range(REQUESTS)]
    per = REQUESTS // ADAPTERS
    return {
        "no_adapter": run_batch(scheduler, ids, [None] * REQUESTS, new_tokens),
        "mixed_adapters": run_batch(scheduler, ids, spread, new_tokens),
        "adapters_one_after_another": sum(
            run_batch(scheduler, ids[k * per : (k + 1) * per], [names[k]] * per, new_tokens) for k in range(ADAPTERS)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=str(RESULTS / "bench_lora.json"))
    args = parser.parse_args()
    base = builtin_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        names = [f"adapter{k}" for k in range(ADAPTERS)]
        paths = [
            f"{n}={write_adapter(base, Path(tmp) / n, seed=k, rank=args.rank, alpha=2 * args.rank, scale=0.02)}"
            for k, n in enumerate(names)
        ]
        scheduler = make_scheduler(base, dtype=args.dtype, lora_paths=tuple(paths), disable_radix_cache=True,
                                   max_total_tokens=16384, context_length=1024)  # fmt: skip
        ids = prompts(REQUESTS, args.prompt_tokens, seed=0)
        run_batch(scheduler, ids[:2], [None, names[0]], 2)  # warm-up: first-pass allocations
        rounds = [sides(scheduler, ids, names, args.new_tokens) for _ in range(args.rounds)]
    report = summarize(rounds, args)
    write_results(Path(args.out), report, dtype=args.dtype)
    print(json.dumps({k: v for k, v in report.items() if k != "rounds_s"}, indent=2))


def summarize(rounds: list[dict[str, float]], args) -> dict:
    tokens = REQUESTS * args.new_tokens
    median = {side: statistics.median(r[side] for r in rounds) for side in rounds[0]}
    throughput = {side: tokens / s for side, s in median.items()}
    return {
        "benchmark": "bench_lora",
        "settings": {
            "requests": REQUESTS,
            "adapters": ADAPTERS,
            "rank": args.rank,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "rounds": args.rounds,
            "model": "built-in (SmolLM2-135M-Instruct)",
            "targets": "q/k/v/o/gate/up/down",
        },  # fmt: skip
        "median_s": median,
        "output_tokens_per_s": throughput,
        "mixed_vs_no_adapter": throughput["mixed_adapters"] / throughput["no_adapter"],
        "mixed_vs_one_after_another": throughput["mixed_adapters"] / throughput["adapters_one_after_another"],
        "target_mixed_vs_no_adapter": 0.8,
        "rounds_s": rounds,
    }


if __name__ == "__main__":
    main()
