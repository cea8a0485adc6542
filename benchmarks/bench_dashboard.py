"""What the live dashboard costs the scheduler: bench_prefix.py's zero-reuse pattern (random
prompts sharing nothing, 32 output tokens each) served by `langrt launch`, in alternating
rounds with and without a poller that GETs /dashboard/state every 500 ms (as an open page does),
in one run on one server.

Two figures: the scheduler's own accounting (seconds spent building and sending snapshots over
seconds spent in steps, in the rounds with the poller: SnapshotReply.snapshot_s / busy_s), which
the issue bounds at 1%; and output tokens/s with and without the poller (medians), which on a
shared 2-core machine is noisier than the effect.

    .venv/bin/python benchmarks/bench_dashboard.py [--quick] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_prefix import random_text  # noqa: E402  (the same prompts as its no_reuse pattern)

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from server_utils import LaunchedServer  # noqa: E402
from results_meta import write_results  # noqa: E402


class Poller:
    """GET /dashboard/state every `interval` seconds on a thread; request latencies kept."""

    def __init__(self, url: str, interval: float):
        self.url, self.interval = url, interval
        self.latencies: list[float] = []
        self.nodes: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            with urllib.request.urlopen(self.url + "/dashboard/state", timeout=30) as resp:
                state = json.loads(resp.read())
            self.latencies.append(time.perf_counter() - start)
            self.nodes.append(len(state["tree"]["nodes"]))
            self._stop.wait(max(0.0, self.interval - (time.perf_counter() - start)))

    def __enter__(self) -> "Poller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def scheduler_time(server) -> dict:
    return server.get("/dashboard/state")[1]["scheduler"]


def one_round(server, prompts: list[str], poll: float | None) -> dict:
    before = scheduler_time(server)
    body = {"text": prompts, "sampling_params": {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}}
    poller = Poller(server.url, poll) if poll else None
    start = time.perf_counter()
    if poller is not None:
        with poller:
            outs = server.post("/generate", body, timeout=600)[1]
    else:
        outs = server.post("/generate", body, timeout=600)[1]
    seconds = time.perf_counter() - start
    after = scheduler_time(server)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {
        "seconds": seconds,
        "output_tok_s": tokens / seconds,
        "busy_s": after["busy_s"] - before["busy_s"],
        "steps": after["steps"] - before["steps"],
        # the snapshot that `after` read is counted; its sending shows only in the next reply
        "snapshot_s": after["snapshot_s"] - before["snapshot_s"],
        "polls": len(poller.latencies) if poller else 0,
        "poll_latency_s": poller.latencies if poller else [],
        "tree_nodes_shown": max(poller.nodes, default=0) if poller else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two rounds of 8 prompts (a smoke run)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    args = parser.parse_args()
    n, rounds = (8, 2) if args.quick else (32, 6)
    server = LaunchedServer("--max-total-tokens", "65536", timeout_s=300)
    rows = {"poller": [], "no_poller": []}
    try:
        for r in range(rounds):
            rng = random.Random(100 + r)
            prompts = [f"{i} {random_text(rng, 60)}" for i in range(n)]  # distinct from the first token
            order = ("poller", "no_poller") if r % 2 == 0 else ("no_poller", "poller")
            for mode in order:
                rows[mode].append(one_round(server, prompts, args.interval if mode == "poller" else None))
                print(f"round {r} {mode}: {rows[mode][-1]['output_tok_s']:.1f} tok/s", flush=True)
    finally:
        server.stop()
    print(json.dumps(report(rows, args, n, rounds), indent=2))


def report(rows: dict, args, n: int, rounds: int) -> dict:
    polled = rows["poller"]
    busy, snap = sum(r["busy_s"] for r in polled), sum(r["snapshot_s"] for r in polled)
    polls = sum(r["polls"] for r in polled)
    latencies = sorted(x for r in polled for x in r["poll_latency_s"])
    on = statistics.median(r["output_tok_s"] for r in polled)
    off = statistics.median(r["output_tok_s"] for r in rows["no_poller"])
    result = {
        "model": "SmolLM2-135M-Instruct (built-in)", "quick": args.quick, "prompts_per_round": n, "rounds": rounds,
        "poll_interval_s": args.interval, "polls": polls,
        "scheduler_snapshot_share_of_step_time": snap / busy if busy else None,
        "snapshot_ms_mean": 1e3 * snap / polls if polls else None,
        "step_ms_mean": 1e3 * busy / max(1, sum(r["steps"] for r in polled)),
        "poll_latency_ms_p50": 1e3 * latencies[len(latencies) // 2] if latencies else None,
        "poll_latency_ms_max": 1e3 * latencies[-1] if latencies else None,
        "tree_nodes_shown_max": max(r["tree_nodes_shown"] for r in polled),
        "output_tok_s_median": {"poller": on, "no_poller": off},
        "throughput_ratio_poller_over_none": on / off,
        "rows": {mode: [{k: v for k, v in r.items() if k != "poll_latency_s"} for r in rs] for mode, rs in rows.items()},
        "cpu": subprocess.run(["sh", "-c", "lscpu | grep 'Model name' | cut -d: -f2"], capture_output=True, text=True).stdout.strip(),
    }  # fmt: skip
    print(f"snapshots cost {100 * result['scheduler_snapshot_share_of_step_time']:.3f} % of the scheduler's step time "
          f"({result['snapshot_ms_mean']:.2f} ms each, steps {result['step_ms_mean']:.1f} ms); output tok/s with the poller "
          f"{on:.1f} vs {off:.1f} without ({on / off:.3f}x)")  # fmt: skip
    out = RESULTS / f"bench_dashboard{'_quick' if args.quick else ''}.json"
    write_results(out, result)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
