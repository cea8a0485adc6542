"""One decode step of a mixture-of-experts model on CPU: langrt's ModelRunner vs transformers'
own forward (its default experts implementation, and "eager", its loop over experts).

The model is Mixtral-shaped and tiny but not trivial (defaults: hidden 1024, 8 experts of 1024
rows, top-2, 4 layers, 16 query / 4 KV heads, 32k vocabulary), random weights (langrt's dummy
load, transformers' own init: the same shapes, so the same work). Each side prefills a prompt of
`--context` tokens, then times single-token steps at batch 1 (and `--batch` sequences at once),
logits included (each step lengthens the context by one, on both sides); blocks of steps
alternate between the sides and the median step is reported.

    .venv/bin/python benchmarks/bench_moe_decode.py [--dtype float32|bfloat16] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from runner_driver import RunnerDriver, make_runner  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def mixtral_config(args):
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=16, num_key_value_heads=4, num_local_experts=args.experts, num_experts_per_tok=2,
        max_position_embeddings=4096,
    )  # fmt: skip


class LangrtSide:
    def __init__(self, path: Path, args):
        sizes = dict(max_total_tokens=8192, max_running_requests=64)
        runner = make_runner(path, dtype=args.dtype, load_format="dummy", **sizes)
        self.driver = RunnerDriver(runner)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 32000, (args.context,), generator=gen).tolist() for _ in range(args.batch)]
        self.driver.prefill(prompts)

    def step(self, rows: int) -> None:
        self.driver.decode(list(range(rows)), [7] * rows)


class HFSide:
    def __init__(self, config, args, experts: str):
        from transformers import AutoModelForCausalLM, DynamicCache

        dtype = getattr(torch, args.dtype)
        self.model = AutoModelForCausalLM.from_config(config, dtype=dtype, experts_implementation=experts).eval()
        self.implementation = self.model.get_experts_implementation()
        self.caches = {}
        gen = torch.Generator().manual_seed(0)
        for rows in sorted({1, args.batch}):
            cache = DynamicCache(config=config)
            ids = torch.randint(0, 32000, (rows, args.context), generator=gen)
            with torch.no_grad():
                self.model(ids, past_key_values=cache, use_cache=True)
            self.caches[rows] = cache

    def step(self, rows: int) -> None:
        with torch.no_grad():
            self.model(torch.full((rows, 1), 7), past_key_values=self.caches[rows], use_cache=True)


def timed_steps(side, rows: int, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        side.step(rows)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="steps per block; 3 blocks per side and batch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = mixtral_config(args)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        sides = {"langrt": LangrtSide(Path(tmp), args)}
        for experts in ("grouped_mm", "eager"):
            sides[f"hf_{experts}"] = HFSide(config, args, experts)
        report = run(sides, args)
    report["hf_experts_implementation"] = {k: s.implementation for k, s in sides.items() if k != "langrt"}
    print(json.dumps(report, indent=2))
    write_results(RESULTS / f"bench_moe_decode_{args.dtype}.json", report, dtype=args.dtype)


def run(sides: dict, args) -> dict:
    # Other processes share the CPU: the load before and after tells how much the figures mean.
    report = {"args": vars(args), "median_step_ms": {}, "load_average_before": os.getloadavg()}
    for rows in (1, args.batch):
        for side in sides.values():
            timed_steps(side, rows, 2)  # warm-up
        times = {name: [] for name in sides}
        for _ in range(3):
            for name, side in sides.items():
                times[name] += timed_steps(side, rows, args.steps)
        medians = {name: round(1000 * statistics.median(t), 2) for name, t in times.items()}
        report["median_step_ms"][f"batch_{rows}"] = medians
    report["load_average_after"] = os.getloadavg()
    return report


if __name__ == "__main__":
    main()
