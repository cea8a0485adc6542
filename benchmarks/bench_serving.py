"""Online serving benchmark against any OpenAI-compatible server, or side by side against llama.cpp.

Streams /v1/chat/completions with a bearer key, at fixed concurrencies (a semaphore) or a Poisson
request rate, and reports TTFT, TPOT and ITL (p50/p99), request and token throughput.

    # against a running server
    .venv/bin/python benchmarks/bench_serving.py --url http://127.0.0.1:30000 --concurrency 8
    # langrt launched for the run (the built-in model, or --model PATH)
    .venv/bin/python benchmarks/bench_serving.py --launch --concurrency 8 --num-requests 64
    # langrt and llama.cpp's own server on one file, 2 threads each, 1, 4 and 16 clients
    .venv/bin/python benchmarks/bench_serving.py --launch langrt,llama-server --model FILE.gguf \\
        --threads 2 --concurrency 1,4,16 --workload chat --llama-server PATH/llama-server

Workloads: `random` (one user turn of --input-words random words) or `chat` (one of a few shared
system prompts, so a prefix cache can reuse them, then a user turn of mixed length). Launched
servers (peers/servers.py) get the same file, threads and KV capacity (--ctx tokens shared by all
requests); llama-server runs --parallel slots with continuous batching on one unified KV buffer.
Each server is started, measured at every concurrency and stopped before the next starts; its
start (process start -> healthy) and its process tree's memory are recorded. ITL is measured
between streamed chunks (one token each on these servers; the chunk counts are recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))

RESULTS = Path(__file__).parent / "results"
WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government").split()  # fmt: skip
# The chat workload's user turns, in words: short questions to pasted documents, mixed in each run.
CHAT_USER_WORDS = (12, 40, 120, 300)
SYSTEM_PROMPTS = 3


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    chunks: int = 0
    error: str = ""


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_prompts(n: int, words: int, seed: int, workload: str = "random") -> list[list[dict]]:
    """`n` conversations (message lists). chat: a shared system prompt (one of SYSTEM_PROMPTS, each
    ~200 words) and a user turn of CHAT_USER_WORDS words, lengths mixed."""
    rng = random.Random(seed)
    if workload == "random":
        return [
            [{"role": "user", "content": f"Request {i}. Continue this text: " + _words(rng, words)}] for i in range(n)
        ]
    systems = [
        f"You are assistant {k} of the records office. Rules: " + _words(rng, 200) for k in range(SYSTEM_PROMPTS)
    ]
    return [
        [{"role": "system", "content": systems[i % SYSTEM_PROMPTS]},
         {"role": "user", "content": f"Request {i}. Summarize: " + _words(rng, rng.choice(CHAT_USER_WORDS))}]
        for i in range(n)
    ]  # fmt: skip


def _request_body(messages: list[dict], args, max_tokens: int) -> dict:
    body = {
        "model": args.model_name, "messages": messages, "max_tokens": max_tokens,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    if args.ignore_eos:
        body["ignore_eos"] = True
    return body


async def _read_stream(resp, result: Result, start: float) -> None:
    last = None
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            result.error = str(chunk["error"].get("message", "error"))
            return
        if chunk.get("usage"):
            result.output_tokens = chunk["usage"]["completion_tokens"]
            result.prompt_tokens = chunk["usage"]["prompt_tokens"]
        if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
            now = time.perf_counter()
            if last is None:
                result.ttft = now - start
            else:
                result.itl.append(now - last)
            last, result.chunks = now, result.chunks + 1
    result.ok = last is not None
    # a server that sends no usage (llama-cpp-python's): one token per chunk
    result.output_tokens = result.output_tokens or result.chunks


async def one_request(session, url: str, headers: dict, messages: list[dict], args, max_tokens: int) -> Result:
    start = time.perf_counter()
    result = Result(ok=False)
    try:
        async with session.post(url, json=_request_body(messages, args, max_tokens), headers=headers) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            await _read_stream(resp, result, start)
    except aiohttp.ClientError as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2e = time.perf_counter() - start
    return result


async def run(args, concurrency: int) -> tuple[list[Result], float]:
    url = args.url.rstrip("/") + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    prompts = make_prompts(args.num_requests, args.input_words, args.seed + concurrency, args.workload)
    semaphore = asyncio.Semaphore(concurrency)
    rng = random.Random(args.seed)

    async def limited(session, messages):
        async with semaphore:
            return await one_request(session, url, headers, messages, args, args.output_len)

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await one_request(session, url, headers, [{"role": "user", "content": "warm up"}], args, 4)
        start = time.perf_counter()
        tasks = []
        for messages in prompts:
            tasks.append(asyncio.create_task(limited(session, messages)))
            if args.request_rate > 0:
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(results: list[Result], wall: float, args, concurrency: int) -> dict:
    ok = [r for r in results if r.ok]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ms = lambda xs, p: 1000 * percentile(xs, p)  # noqa: E731
    return {
        "url": args.url, "concurrency": concurrency, "request_rate": args.request_rate, "workload": args.workload,
        "requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "wall_s": wall, "requests_per_s": len(ok) / wall, "output_tok_per_s": out_tokens / wall,
        "total_tok_per_s": (in_tokens + out_tokens) / wall, "mean_prompt_tokens": in_tokens / max(1, len(ok)),
        "mean_output_tokens": out_tokens / max(1, len(ok)), "mean_chunks": sum(r.chunks for r in ok) / max(1, len(ok)),
        "ttft_ms_p50": ms([r.ttft for r in ok], 50), "ttft_ms_p99": ms([r.ttft for r in ok], 99),
        "tpot_ms_p50": ms(tpot, 50), "tpot_ms_p99": ms(tpot, 99),
        "itl_ms_p50": ms(itl, 50), "itl_ms_p99": ms(itl, 99),
        "e2e_ms_p50": ms([r.e2e for r in ok], 50), "mean_tpot_ms": 1000 * statistics.mean(tpot) if tpot else float("nan"),
    }  # fmt: skip


def print_table(s: dict, server: str) -> None:
    rows = [
        ("requests completed / failed", f"{s['completed']} / {s['failed']}"),
        ("wall time (s)", f"{s['wall_s']:.2f}"),
        ("request throughput (req/s)", f"{s['requests_per_s']:.2f}"),
        ("output token throughput (tok/s)", f"{s['output_tok_per_s']:.1f}"),
        ("total token throughput (tok/s)", f"{s['total_tok_per_s']:.1f}"),
        ("mean prompt / output tokens", f"{s['mean_prompt_tokens']:.0f} / {s['mean_output_tokens']:.0f}"),
        ("TTFT p50 / p99 (ms)", f"{s['ttft_ms_p50']:.1f} / {s['ttft_ms_p99']:.1f}"),
        ("TPOT p50 / p99 (ms)", f"{s['tpot_ms_p50']:.1f} / {s['tpot_ms_p99']:.1f}"),
        ("ITL p50 / p99 (ms)", f"{s['itl_ms_p50']:.1f} / {s['itl_ms_p99']:.1f}"),
        ("E2E p50 (ms)", f"{s['e2e_ms_p50']:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{'=' * (width + 16)}\n{server}: concurrency {s['concurrency']}, request rate {s['request_rate'] or 'inf'}")
    for name, value in rows:
        print(f"{name:<{width}}  {value:>12}")
    if s["errors"]:
        print("errors:", *s["errors"], sep="\n  ")


def sweep(args, server: str) -> list[dict]:
    """Every --concurrency against args.url, one after another."""
    summaries = []
    for concurrency in args.concurrency:
        results, wall = asyncio.run(run(args, concurrency))
        summaries.append(summarize(results, wall, args, concurrency))
        print_table(summaries[-1], server)
    return summaries


def serve_and_sweep(args, server: str, port: int) -> dict:
    """Start `server` on args.model, sweep it, stop it: its start, memory and sweep."""
    from peers.servers import ServerProcess, ServerSpec

    extra = tuple(args.launch_args.split()) if server == "langrt" else ()
    spec = ServerSpec(server, args.model, port, args.threads, args.ctx, args.parallel, args.llama_server, extra)
    proc = ServerProcess(spec)
    args.url = proc.url
    try:
        print(f"{server}: healthy {proc.start_to_health_s:.1f} s after start", flush=True)
        row = {
            "command": spec.command(),
            "start_to_health_s": proc.start_to_health_s,
            "memory_after_load": proc.memory(),
        }
        row["sweep"] = sweep(args, server)
        row["memory_after_runs"] = proc.memory()
    finally:
        proc.stop()
    return row


def compare(servers: dict) -> dict:
    """langrt over each peer at each concurrency (> 1: langrt ahead; for latencies, the peer's over langrt's)."""
    out = {}
    for peer in (name for name in servers if name != "langrt"):
        for ours, theirs in zip(servers["langrt"]["sweep"], servers[peer]["sweep"]):
            out[f"{peer}@{ours['concurrency']}"] = {
                "output_throughput": ours["output_tok_per_s"] / theirs["output_tok_per_s"],
                "ttft_p50_speedup": theirs["ttft_ms_p50"] / ours["ttft_ms_p50"], "ttft_p99_speedup": theirs["ttft_ms_p99"] / ours["ttft_ms_p99"],
                "itl_p50_speedup": theirs["itl_ms_p50"] / ours["itl_ms_p50"], "itl_p99_speedup": theirs["itl_ms_p99"] / ours["itl_ms_p99"],
            }  # fmt: skip
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server base URL (without --launch)")
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--model-name", "--served-model", default="default", help="the request's model field")
    parser.add_argument("--num-requests", type=int, default=64, help="per concurrency")
    parser.add_argument(
        "--concurrency", default="8", help="requests in flight at most; several, comma-separated, run one after another"
    )
    parser.add_argument("--request-rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    parser.add_argument("--workload", choices=["random", "chat"], default="random")
    parser.add_argument("--input-words", type=int, default=60, help="words of random text per prompt (workload random)")
    parser.add_argument("--output-len", type=int, default=64, help="max_tokens per request")
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="send ignore_eos (langrt, llama-server, vLLM, SGLang) for exact lengths",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--launch",
        nargs="?",
        const="langrt",
        default="",
        help="servers to start for the run, comma-separated: langrt, llama-server, llama-cpp-python (bare --launch: langrt)",
    )
    parser.add_argument(
        "--model", default=None, help="model file or directory for launched servers (default: the built-in model)"
    )
    parser.add_argument("--threads", type=int, default=2, help="launched servers' threads")
    parser.add_argument(
        "--ctx", type=int, default=8192, help="launched servers' KV capacity in tokens, all requests together"
    )
    parser.add_argument(
        "--parallel", type=int, default=16, help="llama-server's slots (requests decoded together at most)"
    )
    parser.add_argument("--llama-server", default=None, help="the llama-server binary (default: on PATH)")
    parser.add_argument("--launch-args", default="", help="extra flags for langrt launch")
    parser.add_argument("--out", default=None, help="results JSON (default benchmarks/results/bench_serving.json)")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.launch = [s for s in args.launch.split(",") if s]
    from peers.servers import SERVERS

    unknown = [s for s in args.launch if s not in SERVERS]
    if unknown:
        parser.error(f"--launch {','.join(unknown)}: not one of {', '.join(SERVERS)}")
    return args


def main() -> None:
    from machine_limits import cpu_description, provenance

    args = parse_args()
    if args.launch and args.model is None:
        from langrt.builtin import builtin_model_path

        args.model = str(builtin_model_path())
    report = {**provenance(), **cpu_description(), "model": args.model, "settings": {
        k: getattr(args, k) for k in ("concurrency", "num_requests", "workload", "output_len", "ignore_eos", "threads", "ctx", "parallel")}}  # fmt: skip
    if args.launch:
        report["servers"] = {server: serve_and_sweep(args, server, 30123 + i) for i, server in enumerate(args.launch)}
        if "langrt" in report["servers"] and len(report["servers"]) > 1:
            report["langrt_vs_peers"] = compare(report["servers"])
            print(json.dumps(report["langrt_vs_peers"], indent=2))
    else:
        report["servers"] = {args.url: {"sweep": sweep(args, args.url)}}
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / "bench_serving.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
