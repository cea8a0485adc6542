"""benchmarks/bench_prefix.py's hit rate is each run's own: a flushed engine running prompts it
has seen before reports (almost) no hits, where the engine's running total would not."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_prefix  # noqa: E402


def test_after_a_flush_a_no_reuse_workload_hits_under_five_percent(new_engine, tiny_llama_dir):
    on = new_engine(tiny_llama_dir, max_total_tokens=4096)
    off = new_engine(tiny_llama_dir, max_total_tokens=4096, disable_radix_cache=True)
    bench_prefix.run_no_reuse(on, off, n=4, rounds=1)
    again = bench_prefix.run_no_reuse(on, off, n=4, rounds=1)  # the same prompts (same seeds)
    assert again["cache_on"]["cache_hit_rate"] < 0.05
    assert again["cache_off"]["cache_hit_rate"] == 0.0

    # Without a flush the same prompts are found whole: the low figure above is the flush's.
    rng = random.Random(100)
    prompts = [f"{i} {bench_prefix.random_text(rng, 60)}" for i in range(4)]
    outs = on.generate(prompts, {"max_new_tokens": 2, "temperature": 0})
    assert bench_prefix.hit_rate(outs) > 0.5
