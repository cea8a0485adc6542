"""Prefix cache and cache-aware scheduling on the built-in model, side by side in one run.

Workloads (SmolLM2-135M-Instruct, greedy, chat template):
  few_shot     one ~1,100-token few-shot preamble shared by every question, short answers
  chat_4_turn  conversations of 4 turns (~150-token user messages, 8-token answers), turn by turn
  no_reuse     random prompts that share nothing: the cache's pure overhead
  policy       8 prefix groups x 16 requests, shuffled, in a pool too small to keep every group:
               lpm vs fcfs hit rate and throughput, and the hit rate as a fraction of the offline
               optimum (every distinct prefix token computed exactly once)
Each cache-on run is compared with the same engine settings and --disable-radix-cache. Every
run starts on flushed engines, and its hit rate is its own requests' (cached prompt tokens over
prompt tokens, from each request's meta_info), not the engine's running total.

    .venv/bin/python benchmarks/bench_prefix.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import langrt

sys.path.insert(0, str(Path(__file__).parent))
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
WORDS = ("apple river stone cloud lamp tiger violin garden rocket silver window forest candle "
         "bridge ocean pencil mirror thunder castle meadow").split()  # fmt: skip


def chat(tokenizer, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def few_shot_prompts(tokenizer, n: int) -> list[str]:
    shots = []
    for i in range(60):
        a, b = (i * 7) % 23, (i * 5) % 19
        shots.append(f"Q: What is {a} plus {b}?\nA: {a + b}.")
    preamble = "Answer each arithmetic question with a number.\n\n" + "\n\n".join(shots)
    return [
        chat(
            tokenizer,
            [{"role": "system", "content": preamble}, {"role": "user", "content": f"Q: What is {i} plus {i + 3}?"}],
        )
        for i in range(n)
    ]


def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def flush(engine) -> None:
    if not engine.flush_cache():
        raise RuntimeError("flush_cache refused: requests still running, the run would reuse their KV")


def timed(engine, prompts, params) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    return time.perf_counter() - start, outs


def hit_rate(outs: list[dict]) -> float:
    """Of these requests' prompt tokens, the share read from the prefix cache."""
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    return sum(o["meta_info"].get("cached_tokens", 0) for o in outs) / prompt if prompt else 0.0


def summary(seconds: float, outs: list[dict]) -> dict:
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"seconds": seconds, "requests_s": len(outs) / seconds, "output_tok_s": tokens / seconds,
            "cache_hit_rate": hit_rate(outs)}  # fmt: skip


def run_few_shot(on, off, n: int) -> dict:
    prompts = few_shot_prompts(on.tokenizer, n)
    params = {"max_new_tokens": 8, "temperature": 0}
    row = {"preamble_tokens": len(on.tokenizer.encode(prompts[0])) - 20}
    for name, engine in (("cache_on", on), ("cache_off", off)):
        flush(engine)
        row[name] = summary(*timed(engine, prompts, params))
    return row


def run_chat(on, off, conversations: int) -> dict:
    rng = random.Random(0)
    user_turns = [[random_text(rng, 110) + " What do you think?" for _ in range(4)] for _ in range(conversations)]
    row = {}
    for name, engine in (("cache_on", on), ("cache_off", off)):
        flush(engine)
        histories = [[] for _ in range(conversations)]
        total, outs_all = 0.0, []
        for turn in range(4):
            for h, turns in zip(histories, user_turns):
                h.append({"role": "user", "content": turns[turn]})
            seconds, outs = timed(
                engine, [chat(engine.tokenizer, h) for h in histories], {"max_new_tokens": 8, "temperature": 0}
            )
            total += seconds
            outs_all += outs
            for h, o in zip(histories, outs):
                h.append({"role": "assistant", "content": o["text"]})
        row[name] = summary(total, outs_all)
    return row


def run_no_reuse(on, off, n: int, rounds: int) -> dict:
    """Alternating rounds, medians: the overhead is small and the machine is noisy. Each round
    has prompts of its own and starts on flushed engines; the hit rate is over every round's
    requests."""
    times = {"cache_on": [], "cache_off": []}
    outs = {}
    for r in range(rounds):
        rng = random.Random(100 + r)
        prompts = [f"{i} {random_text(rng, 60)}" for i in range(n)]  # distinct from the first token
        for name, engine in (
            (("cache_on", on), ("cache_off", off)) if r % 2 == 0 else (("cache_off", off), ("cache_on", on))
        ):
            flush(engine)
            seconds, outs_round = timed(engine, prompts, {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True})
            times[name].append(seconds)
            outs.setdefault(name, []).extend(outs_round)
    row = {}
    for name, t in times.items():
        row[name] = summary(statistics.median(t), outs[name][: len(outs[name]) // rounds])
        row[name]["cache_hit_rate"] = hit_rate(outs[name])
    row["rounds"] = rounds
    return row


def run_policies(model_args: dict, groups: int, per_group: int) -> dict:
    rng = random.Random(1)
    prefixes = [random_text(rng, 300) for _ in range(groups)]
    prompts = [f"{prefixes[g]} Question {i}: {random_text(rng, 6)}" for g in range(groups) for i in range(per_group)]
    rng.shuffle(prompts)
    row = {}
    for policy in ("lpm", "fcfs"):
        # Room for about three groups' prefixes at once: the order decides what gets reused.
        with langrt.Engine(schedule_policy=policy, max_total_tokens=1500, **model_args) as engine:
            ids = [engine.tokenizer.encode(p) for p in prompts]
            start = time.perf_counter()
            outs = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 4, "temperature": 0})
            row[policy] = summary(time.perf_counter() - start, outs)
            row[policy]["evicted_tokens"] = engine.cache_stats()["evicted_tokens"]
    distinct = {tuple(p[: i + 1]) for p in ids for i in range(len(p))}
    total = sum(map(len, ids))
    row["optimal_hit_rate"] = (total - len(distinct)) / total
    for policy in ("lpm", "fcfs"):
        row[policy]["fraction_of_optimum"] = row[policy]["cache_hit_rate"] / row["optimal_hit_rate"]
    return row


def ratio(row: dict, key: str = "requests_s") -> float:
    return row["cache_on"][key] / row["cache_off"][key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small workloads (a smoke run)")
    args = parser.parse_args()
    model_args = dict(log_level="warning")
    with (
        langrt.Engine(max_total_tokens=65536, **model_args) as on,
        langrt.Engine(max_total_tokens=65536, disable_radix_cache=True, **model_args) as off,
    ):
        results = run_cache_workloads(on, off, args.quick)
    results["policy"] = row = run_policies(model_args, 4 if args.quick else 8, 4 if args.quick else 16)
    print(f"policy: lpm hit {row['lpm']['cache_hit_rate']:.1%} ({row['lpm']['fraction_of_optimum']:.1%} of optimum "
          f"{row['optimal_hit_rate']:.1%}), {row['lpm']['requests_s']:.2f} req/s | fcfs hit "
          f"{row['fcfs']['cache_hit_rate']:.1%} ({row['fcfs']['fraction_of_optimum']:.1%}), "
          f"{row['fcfs']['requests_s']:.2f} req/s", flush=True)  # fmt: skip
    out = RESULTS / f"bench_prefix{'_quick' if args.quick else ''}.json"
    write_results(out, results, dtype=results["dtype"])
    print(f"wrote {out}")


def run_cache_workloads(on, off, q: bool) -> dict:
    """few_shot, chat_4_turn and no_reuse on the cache-on and cache-off engines."""
    results = {"model": "SmolLM2-135M-Instruct (built-in)", "dtype": on.args.dtype, "quick": q}

    results["few_shot"] = row = run_few_shot(on, off, 8 if q else 64)
    print(f"few_shot ({row['preamble_tokens']}-token preamble): {ratio(row):.2f}x requests/s with the cache "
          f"(hit rate {row['cache_on']['cache_hit_rate']:.1%})", flush=True)  # fmt: skip
    results["chat_4_turn"] = row = run_chat(on, off, 4 if q else 16)
    print(f"chat_4_turn: {ratio(row):.2f}x (hit rate {row['cache_on']['cache_hit_rate']:.1%})", flush=True)
    results["no_reuse"] = row = run_no_reuse(on, off, 8 if q else 32, 2 if q else 5)
    overhead = 1 - ratio(row, "output_tok_s")
    row["cache_overhead"] = overhead
    print(f"no_reuse: cache on/off {ratio(row, 'output_tok_s'):.3f} (overhead {overhead:+.1%})", flush=True)
    for name in ("few_shot", "chat_4_turn", "no_reuse"):
        results[name]["speedup_requests_s"] = ratio(results[name])
    return results


if __name__ == "__main__":
    main()
