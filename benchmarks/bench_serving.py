"""Online serving benchmark against any OpenAI-compatible server.

Streams /v1/chat/completions with a bearer key, at a fixed concurrency (a semaphore) or a
Poisson request rate, and reports TTFT, TPOT and ITL (p50/p99), request and token throughput.

    # against a running server
    .venv/bin/python benchmarks/bench_serving.py --url http://127.0.0.1:30000 --concurrency 8
    # or let it launch langrt on the built-in model for the run
    .venv/bin/python benchmarks/bench_serving.py --launch --concurrency 8 --num-requests 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

RESULTS = Path(__file__).parent / "results"
WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government").split()  # fmt: skip


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""


def make_prompts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Request {i}. Continue this text: " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


async def one_request(session, url: str, headers: dict, prompt: str, args) -> Result:
    body = {
        "model": args.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": args.output_len,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    if args.ignore_eos:
        body["ignore_eos"] = True
    start = time.perf_counter()
    result = Result(ok=False)
    last = None
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = chunk["error"].get("message", "error")
                    return result
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
    except aiohttp.ClientError as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2e = time.perf_counter() - start
    result.ok = last is not None
    return result


async def run(args) -> tuple[list[Result], float]:
    url = args.url.rstrip("/") + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    prompts = make_prompts(args.num_requests, args.input_words, args.seed)
    semaphore = asyncio.Semaphore(args.concurrency)
    rng = random.Random(args.seed)

    async def limited(session, prompt):
        async with semaphore:
            return await one_request(session, url, headers, prompt, args)

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await one_request(session, url, headers, "warm up", argparse.Namespace(**{**vars(args), "output_len": 4}))
        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(session, prompt)))
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


def summarize(results: list[Result], wall: float, args) -> dict:
    ok = [r for r in results if r.ok]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ms = lambda xs, p: 1000 * percentile(xs, p)  # noqa: E731
    return {
        "url": args.url, "concurrency": args.concurrency, "request_rate": args.request_rate,
        "requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "wall_s": wall, "requests_per_s": len(ok) / wall, "output_tok_per_s": out_tokens / wall,
        "total_tok_per_s": (in_tokens + out_tokens) / wall, "mean_prompt_tokens": in_tokens / max(1, len(ok)),
        "mean_output_tokens": out_tokens / max(1, len(ok)),
        "ttft_ms_p50": ms([r.ttft for r in ok], 50), "ttft_ms_p99": ms([r.ttft for r in ok], 99),
        "tpot_ms_p50": ms(tpot, 50), "tpot_ms_p99": ms(tpot, 99),
        "itl_ms_p50": ms(itl, 50), "itl_ms_p99": ms(itl, 99),
        "e2e_ms_p50": ms([r.e2e for r in ok], 50), "mean_tpot_ms": 1000 * statistics.mean(tpot) if tpot else float("nan"),
    }  # fmt: skip


def print_table(s: dict) -> None:
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
    print(f"{'=' * (width + 16)}\nconcurrency {s['concurrency']}, request rate {s['request_rate'] or 'inf'}")
    for name, value in rows:
        print(f"{name:<{width}}  {value:>12}")
    if s["errors"]:
        print("errors:", *s["errors"], sep="\n  ")


def launch_langrt(port: int, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "langrt", "launch", "--port", str(port), "--log-level", "warning", *extra]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = process.stdout.readline()
    if "serving" not in line:
        process.kill()
        raise RuntimeError(f"langrt launch failed: {line}{process.stdout.read()}")
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server base URL")
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--model", default="default", help="the request's model field")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    parser.add_argument("--request-rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    parser.add_argument("--input-words", type=int, default=60, help="words of random text per prompt")
    parser.add_argument("--output-len", type=int, default=64, help="max_tokens per request")
    parser.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (langrt, vLLM, SGLang) for exact lengths")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--launch", action="store_true", help="launch langrt on the built-in model for this run")
    parser.add_argument("--launch-args", default="", help="extra flags for langrt launch")
    parser.add_argument("--out", default=None, help="results JSON (default benchmarks/results/bench_serving.json)")
    args = parser.parse_args()
    process = None
    if args.launch:
        port = 30123
        args.url = f"http://127.0.0.1:{port}"
        process = launch_langrt(port, args.launch_args.split())
    try:
        results, wall = asyncio.run(run(args))
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
    summary = summarize(results, wall, args)
    print_table(summary)
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / "bench_serving.json"
    out.write_text(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
