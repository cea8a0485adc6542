"""The router over 2 replicas on a multi-tenant workload (issue 27), in one run.

Several tenants, each with its own few-shot preamble of a few hundred tokens, send questions
interleaved (in a seeded random order), a few at a time. Configurations, each on fresh servers:

  single       one replica whose KV pool is the two replicas' together (the hit-rate anchor)
  cache_aware  2 replicas behind `langrt router --policy cache_aware`
  round_robin  2 replicas behind `langrt router --policy round_robin`
  kill         cache_aware again; one replica SIGKILLed a third of the way through

Each replica's pool holds about half the tenants' preambles: cache-aware routing keeps each
tenant on one replica, where its preamble stays cached; round robin sends every tenant to both
and each pool cycles through all of them. Hit rate = prompt tokens served from cache over
prompt tokens (sum of meta_info cached_tokens / prompt_tokens), and each worker's own
/get_server_info cache_hit_rate. On a 2-core machine the two replicas share the two cores (one
torch thread each): the gain measured is the prefill the cache saves, not added hardware.

    TORCH_EXTENSIONS_DIR=/work/ext_helper_f python benchmarks/bench_router.py [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from server_utils import LaunchedRouter, LaunchedServer  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TOPICS = [
    "bakery",
    "bicycle repair",
    "tax forms",
    "garden plants",
    "train tickets",
    "museum tours",
    "phone plans",
    "pet care",
]


def preamble(tenant: int, shots: int) -> str:
    topic = TOPICS[tenant % len(TOPICS)]
    lines = [f"Tenant {tenant}. You answer customers of a {topic} business in one short sentence.\n"]
    for k in range(shots):
        lines.append(
            f"Q: What about {topic} item number {k} on the {tenant}th list?\nA: Item {k} of {topic} is in stock and costs {k + tenant} dollars.\n"
        )
    return "".join(lines)


def workload(tenants: int, per_tenant: int, shots: int, seed: int = 0) -> list[str]:
    """Every tenant's questions, interleaved in a seeded random order (a fixed i % T order
    would line tenants up with round robin's alternation and hide what it does)."""
    pre = [preamble(t, shots) for t in range(tenants)]
    order = [t for t in range(tenants) for _ in range(per_tenant)]
    random.Random(seed).shuffle(order)
    return [pre[t] + f"Q: Question {i} about {TOPICS[t % len(TOPICS)]}?\nA:" for i, t in enumerate(order)]


def run(url_server, prompts: list[str], concurrency: int, max_new: int, on_progress=None) -> dict:
    body = lambda p: {"text": p, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
    done, lock = [0], threading.Lock()

    def one(p):
        status, out = url_server.post("/generate", body(p), check=False, timeout=600)
        with lock:
            done[0] += 1
            if on_progress:
                on_progress(done[0])
        return status, out

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, prompts))
    seconds = time.perf_counter() - start
    ok = [out for status, out in results if status == 200]
    prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in ok)
    cached = sum(o["meta_info"]["cached_tokens"] for o in ok)
    output = sum(o["meta_info"]["completion_tokens"] for o in ok)
    return {
        "requests": len(prompts),
        "succeeded": len(ok),
        "failed": [(status, out) for status, out in results if status != 200],
        "seconds": round(seconds, 2),
        "requests_s": round(len(ok) / seconds, 3),
        "output_tok_s": round(output / seconds, 2),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "hit_rate": round(cached / prompt_tokens, 4) if prompt_tokens else 0.0,
    }


def server_hit_rates(workers) -> list:
    rates = []
    for w in workers:
        status, info = w.get("/get_server_info", check=False)
        rates.append(info.get("cache_hit_rate") if status == 200 and isinstance(info, dict) else None)
    return rates


def with_workers(n: int, pool_tokens: int, threads: int, fn) -> dict:
    workers = [LaunchedServer("--max-total-tokens", str(pool_tokens), "--num-threads", str(threads)) for _ in range(n)]
    try:
        row = fn(workers)
        row["worker_cache_hit_rate"] = server_hit_rates(workers)
        return row
    finally:
        for w in workers:
            w.stop()


def routed(policy: str, prompts, args, kill_at: int | None = None):
    def fn(workers):
        router = LaunchedRouter(
            "--worker-urls", *(w.url for w in workers), "--policy", policy, "--health-check-interval", "1"
        )
        killed = []

        def progress(done):
            if kill_at is not None and done == kill_at and not killed:
                busy = {w["url"]: w["in_flight"] for w in router.get("/list_workers")[1]["workers"]}
                victim = max(workers, key=lambda w: busy[w.url])
                victim.process.send_signal(signal.SIGKILL)
                killed.append({"url": victim.url, "in_flight_when_killed": busy[victim.url], "after_done": done})

        try:
            row = run(router, prompts, args.concurrency, args.max_new_tokens, progress)
            listed = router.get("/list_workers")[1]
            row["sent_per_worker"] = [w["sent"] for w in listed["workers"]]
            row["router_retries"] = listed["retries"]
            if killed:
                row["killed"] = killed[0]
            return row
        finally:
            router.stop()

    return with_workers(2, args.pool_tokens, 1, fn)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--per-tenant", type=int, default=8)
    parser.add_argument("--shots", type=int, default=12, help="few-shot examples per preamble (~25 tokens each)")
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument(
        "--pool-tokens", type=int, default=1400, help="KV pool per replica (the single replica gets twice this)"
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.tenants, args.per_tenant = 4, 4
    prompts = workload(args.tenants, args.per_tenant, args.shots)
    rows = {}
    rows["single"] = with_workers(
        1, 2 * args.pool_tokens, 2, lambda ws: run(ws[0], prompts, args.concurrency, args.max_new_tokens)
    )
    print("single", json.dumps(rows["single"]), flush=True)
    for policy in ("cache_aware", "round_robin"):
        rows[policy] = routed(policy, prompts, args)
        print(policy, json.dumps(rows[policy]), flush=True)
    rows["kill"] = routed("cache_aware", prompts, args, kill_at=len(prompts) // 3)
    print("kill", json.dumps(rows["kill"]), flush=True)
    report(args, prompts, rows)


def report(args, prompts, rows) -> None:
    ca, rr, single = rows["cache_aware"], rows["round_robin"], rows["single"]
    summary = {
        "cache_aware_hit_rate_vs_single": round(ca["hit_rate"] / single["hit_rate"], 3) if single["hit_rate"] else None,
        "cache_aware_vs_round_robin_throughput": round(ca["output_tok_s"] / rr["output_tok_s"], 3),
        "cache_aware_vs_round_robin_requests_s": round(ca["requests_s"] / rr["requests_s"], 3),
        "kill_lost_requests": rows["kill"]["requests"] - rows["kill"]["succeeded"],
    }
    result = {
        "settings": {**vars(args), "requests": len(prompts), "preamble_chars": len(preamble(0, args.shots))},
        "cpu": _cpu(),
        "rows": rows,
        "summary": summary,
    }
    print(json.dumps(summary, indent=1))
    name = "bench_router_quick.json" if args.quick else "bench_router.json"
    write_results(RESULTS / name, result)


def _cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")), "unknown")
    flags = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return f"{model}; {'avx512f' if 'avx512f' in flags else 'avx2' if 'avx2' in flags else 'no avx2'}"


if __name__ == "__main__":
    main()
