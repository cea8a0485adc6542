"""Tensor parallelism (--tp-size 2, gloo on CPU) vs one process, side by side in one run (built-in
model, greedy, float32 by default).

Four engines are up at once: one process with one thread, one process with two threads (the
same cores as two ranks), two ranks of one thread each, and the same with every sum over gloo
(LANGRT_TP_SHM=0: no shared-memory all-reduce). Each wave (a batch of prompts, 64 new
tokens each) runs on every engine in turn, the order rotating per round (the machine is shared:
a noisy moment lands on every side). Reports output tok/s per engine and batch size, the ratios
to the two-thread process, and whether the ranks' outputs equal the one process's.

    .venv/bin/python benchmarks/bench_tp.py [--dtype float32] [--batches 1,8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import langrt
from langrt.parallel import shm

sys.path.insert(0, str(Path(__file__).parent))
from bench_offline import cpu_flags_summary  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PROMPTS = ["Tell me a story about a lighthouse.", "Explain how rain forms.", "Write a poem about autumn.",
           "Describe a busy market.", "Give three tips for learning to cook.", "What do bees do in winter?",
           "Describe the sea at night.", "Explain what a library is for."]  # fmt: skip
ENGINES = {"tp1 x1 thread": dict(tp_size=1, num_threads=1), "tp1 x2 threads": dict(tp_size=1, num_threads=2),
           "tp2 x1 thread each": dict(tp_size=2, num_threads=1), "tp2 gloo only": dict(tp_size=2, num_threads=1)}  # fmt: skip


def wave(engine, batch: int, new_tokens: int) -> tuple[float, list]:
    """(output tok/s, output ids) of one batch of greedy requests."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    engine.flush_cache()
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    took = time.perf_counter() - start
    return sum(o["meta_info"]["completion_tokens"] for o in outs) / took, [o["output_ids"] for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    a = parser.parse_args()
    engines = {}
    for name, kw in ENGINES.items():  # "gloo only": every sum over torch.distributed (no shared memory)
        os.environ[shm.ENV] = "0" if name == "tp2 gloo only" else "1"
        engines[name] = langrt.Engine(dtype=a.dtype, max_total_tokens=8192, log_level="warning", **kw)
    os.environ.pop(shm.ENV)
    results, same = {}, True
    try:
        for batch in map(int, a.batches.split(",")):
            rates = {name: [] for name in engines}
            for r in range(a.rounds):
                names = list(engines)[r % len(engines) :] + list(engines)[: r % len(engines)]
                outputs = {}
                for name in names:
                    rate, outputs[name] = wave(engines[name], batch, a.new_tokens)
                    rates[name].append(rate)
                same &= outputs["tp2 x1 thread each"] == outputs["tp1 x1 thread"] == outputs["tp2 gloo only"]
            best = {name: max(v) for name, v in rates.items()}
            results[batch] = {"tok_s_best": best, "tok_s_all": rates,
                              "ratio_tp2_to_tp1x2": best["tp2 x1 thread each"] / best["tp1 x2 threads"],
                              "ratio_tp2_to_tp1x1": best["tp2 x1 thread each"] / best["tp1 x1 thread"],
                              "ratio_shm_to_gloo": best["tp2 x1 thread each"] / best["tp2 gloo only"]}  # fmt: skip
            print(f"batch {batch}: " + ", ".join(f"{n} {v:.1f} tok/s" for n, v in best.items())
                  + f"; tp2 / tp1x2 threads {results[batch]['ratio_tp2_to_tp1x2']:.2f}x", flush=True)  # fmt: skip
    finally:
        for engine in engines.values():
            engine.shutdown()
    print(f"tp2 outputs equal tp1's: {same}")
    out = {"dtype": a.dtype, "cpu_flags": cpu_flags_summary(), "cores": len(os.sched_getaffinity(0)),
           "load_avg_at_end": os.getloadavg(), "outputs_equal": same, "batches": results}  # fmt: skip
    write_results(RESULTS / "bench_tp.json", out)


if __name__ == "__main__":
    main()
