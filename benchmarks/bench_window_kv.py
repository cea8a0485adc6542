"""What keeping only the window's K/V in sliding-window layers saves (langrt/mem/window_pool.py):
KV bytes one request holds at a long context, and the decode step time, with the window layers'
own pool and without it (every layer keeping every token, the pool langrt had before).

The model is Gemma 3 270M's shape (18 layers of which every sixth is full attention, the other
15 slide over 512 tokens; one KV head of 256; 640 wide, 262k vocabulary), random weights
(langrt's dummy load). Each side prefills one prompt of `--context` tokens in chunks through a
CacheManager as the scheduler does (window K/V dropped between passes), then times single-token
decode steps at batch 1, logits of the new token included; blocks of steps alternate between
the sides on one model and the median step is reported.

`--attention-only` times the attention of a decode step alone (the backend's per-pass setup
and its 18 layers' attend, on the same batch each time), where the window pool's extra work
(the window table) would show; the prompt's slots are then reserved and cached without running
the model (their K/V stay zero, which attention reads at the same cost).

    .venv/bin/python benchmarks/bench_window_kv.py [--context 4096] [--dtype bfloat16] [--attention-only]
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
from runner_driver import make_runner  # noqa: E402
from results_meta import write_results  # noqa: E402

from langrt.mem.cache_manager import CacheManager  # noqa: E402
from langrt.mem.pools import TokenToKVPool  # noqa: E402
from langrt.mem.window_pool import KVSplit  # noqa: E402
from langrt.model.attention import create_attention_backend  # noqa: E402
from langrt.model.forward_batch import ForwardBatch, ForwardMode  # noqa: E402

RESULTS = Path(__file__).parent / "results"
VOCAB = 262144


def gemma3_270m_dir(path: Path) -> Path:
    from transformers import Gemma3TextConfig

    Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window=512, max_position_embeddings=32768,
        query_pre_attn_scalar=256, rope_theta=1e6, rope_local_base_freq=1e4,
    ).save_pretrained(path)  # fmt: skip
    return path


class Seq:
    def __init__(self, ids: list[int]):
        self.all_ids, self.kv_len, self.cached_len, self.cache_node, self.kv_row = ids, 0, 0, None, None
        self.cache_ids = ids  # what its cached prefixes are keyed by


class Side:
    """One pool layout over the shared model: its CacheManager, attention backend, one request."""

    def __init__(self, runner, kv_pool, args):
        self.runner, self.kv_pool = runner, kv_pool
        self.backend = create_attention_backend(runner.args.attention_backend, runner.config, kv_pool, runner.req_pool)
        # window K/V dropped after every pass: what a request holds under pressure
        self.cm = CacheManager(runner.req_pool, kv_pool, radix=True, eager_window_drop=True)
        gen = torch.Generator().manual_seed(0)
        self.seq = Seq(torch.randint(100, VOCAB, (args.context,), generator=gen).tolist())
        assert self.cm.open(self.seq, self.cm.match([]))
        while self.seq.kv_len < args.context:
            n = min(args.chunk, args.context - self.seq.kv_len)
            if args.attention_only:
                assert self.cm.reserve(self.seq, self.seq.kv_len, n)
                self.seq.kv_len += n
            else:
                self.run(n)
            self.cm.share(self.seq)

    def run(self, n: int) -> None:
        seq, cm = self.seq, self.cm
        assert cm.reserve(seq, seq.kv_len, n)
        slots = cm.slots(seq, seq.kv_len, seq.kv_len + n)
        mode = ForwardMode.DECODE if n == 1 else ForwardMode.EXTEND
        batch = ForwardBatch.build(mode, seq.all_ids[seq.kv_len : seq.kv_len + n], slots, [seq.kv_row],
                                   [seq.kv_len + n], [n], self.runner.device)  # fmt: skip
        self.runner.attn_backend = self.backend
        hidden = self.runner.forward(batch)
        self.runner.compute_logits(hidden[-1:])
        seq.kv_len += n

    def step(self) -> None:
        self.seq.all_ids.append(7)
        self.run(1)
        self.cm.trim(self.seq, self.seq.kv_len)

    def kv_bytes(self) -> dict:
        """Bytes of K/V the request's positions hold, per pool."""
        slots = self.cm.slots(self.seq, 0, self.seq.kv_len)
        pool, config = self.kv_pool, self.runner.config
        windows = tuple(config.window_of(i) for i in range(config.num_layers))
        if pool.window is None:
            per_token = TokenToKVPool.bytes_per_token(
                config.num_layers, config.num_kv_heads, config.head_dim, pool.dtype
            )
            return {"full_slots": len(slots), "window_slots": 0, "bytes": len(slots) * per_token}
        split = KVSplit.of(windows, config.num_kv_heads, config.head_dim, pool.dtype)
        held = int((pool.full_to_window[slots] >= 0).sum())
        return {"full_slots": len(slots), "window_slots": held,
                "bytes": len(slots) * split.full_bytes + held * split.window_bytes}  # fmt: skip


def timed_attention(side: Side, steps: int) -> list[float]:
    """The attention of one decode step, `steps` times over the same batch (one new slot)."""
    seq, runner, config = side.seq, side.runner, side.runner.config
    seq.all_ids.append(7)
    assert side.cm.reserve(seq, seq.kv_len, 1)
    batch = ForwardBatch.build(ForwardMode.DECODE, [7], side.cm.slots(seq, seq.kv_len, seq.kv_len + 1), [seq.kv_row],
                               [seq.kv_len + 1], [1], runner.device)  # fmt: skip
    q = torch.randn(1, config.num_heads * config.head_dim, dtype=runner.dtype)
    k, v = (torch.randn(1, config.num_kv_heads * config.head_dim, dtype=runner.dtype) for _ in range(2))
    times = []
    with torch.inference_mode():
        for _ in range(steps):
            start = time.perf_counter()
            attn = side.backend.prepare(batch)
            for layer in range(config.num_layers):
                attn.attend(layer, q, k, v)
            times.append(time.perf_counter() - start)
    seq.all_ids.pop()
    side.cm.trim(seq, seq.kv_len + 1)
    return times


def timed(side: Side, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        side.step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=1024, help="prompt tokens per prefill pass")
    parser.add_argument("--steps", type=int, default=8, help="decode steps per timed block")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks per side, alternating")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention-backend", default="cpu")
    parser.add_argument("--attention-only", action="store_true", help="time the attention of a decode step alone")
    parser.add_argument("--out", default=None, help="results file (default: results/bench_window_kv[_attention].json)")
    args = parser.parse_args()
    args.out = args.out or str(RESULTS / f"bench_window_kv{'_attention' if args.attention_only else ''}.json")
    report = {"args": vars(args), "load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        runner = make_runner(gemma3_270m_dir(Path(tmp)), dtype=args.dtype, load_format="dummy", attention_backend=args.attention_backend,
                             max_total_tokens=args.context + 64 * (args.steps * args.blocks + 1), max_running_requests=2)  # fmt: skip
    report["pools"] = {"full_tokens": runner.plan.max_total_tokens, "window_tokens": runner.plan.window_tokens}
    config = runner.config
    plain = TokenToKVPool(
        runner.plan.max_total_tokens, config.num_layers, config.num_kv_heads, config.head_dim, runner.dtype, "cpu"
    )
    sides = {"window_pool": Side(runner, runner.kv_pool, args), "one_pool": Side(runner, plain, args)}
    times = {name: [] for name in sides}
    for _ in range(args.blocks):
        for name, side in sides.items():
            times[name] += (timed_attention if args.attention_only else timed)(side, args.steps)
    report["kv_bytes_per_request"] = {name: side.kv_bytes() for name, side in sides.items()}
    report["median_step_ms"] = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    kv = report["kv_bytes_per_request"]
    report["kv_bytes_ratio_window_over_one_pool"] = kv["window_pool"]["bytes"] / kv["one_pool"]["bytes"]
    report["step_time_ratio_window_over_one_pool"] = (
        report["median_step_ms"]["window_pool"] / report["median_step_ms"]["one_pool"]
    )
    report["load_average_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    write_results(Path(args.out), report, dtype=args.dtype)


if __name__ == "__main__":
    main()
