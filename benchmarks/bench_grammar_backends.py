"""The grammar backends inside the runtime: bench_json.py's extraction workload (its schema,
documents and measurements) served with --grammar-backend langrt, xgrammar and llguidance, one
Engine per backend, started one after another (built-in model, greedy). langrt runs twice: as
served (jump-forward on) and token by token (--disable-jump-forward, what the other engines do),
so the engines' own cost shows apart from jump-forward's savings.

Per backend: output tok/s and forward passes for waves of 1, 4 and 16 requests (median of the
rounds, after a warm-up of the whole workload), outputs valid against the schema, and what a new
schema costs the request that brings it, first-request latency minus the same request once the
grammar is cached (prefix cache flushed both times; median over fresh variants of the schema):
- `compile_s`: for one output token, i.e. the compile before the first token;
- `first_output_extra_s`: for the whole output (langrt also computes each state's token mask on
  first visit, and learns the drafts' spellings, so its warm run is faster for both reasons).

    .venv/bin/python benchmarks/bench_grammar_backends.py [--quick] [--dtype float32] [--batches 1,16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import langrt
from bench_json import RESULTS, SCHEMA, chat_prompts, count_valid, timed
from results_meta import write_results  # noqa: E402

CONFIGS = {  # name -> Engine settings
    "langrt": {"grammar_backend": "langrt"},
    "langrt_token_by_token": {"grammar_backend": "langrt", "disable_jump_forward": True},
    "xgrammar": {"grammar_backend": "xgrammar"},
    "llguidance": {"grammar_backend": "llguidance"},
}
MAX_NEW_TOKENS = 160  # as bench_json: every extraction ends well within it


def schema_variant(i: int) -> dict:
    """SCHEMA with a bound changed: a new grammar for every engine's cache, the same workload."""
    variant = json.loads(json.dumps(SCHEMA))
    variant["properties"]["name"]["maxLength"] = 41 + i
    return variant


def first_request_cost(engine, prompt: str, variants: int) -> dict:
    """Latency of a request whose schema is new, minus the same request again (grammar cached),
    for one output token and for the whole output; medians over `variants` fresh schemas."""

    def latency(schema: dict, max_new_tokens: int) -> float:
        engine.flush_cache()
        start = time.perf_counter()
        engine.generate(prompt, {"json_schema": schema, "max_new_tokens": max_new_tokens, "temperature": 0})
        return time.perf_counter() - start

    # the engine's one-time set-up (langrt's vocabulary, the other engines' tokenizer tables) is
    # the first constrained request's, whatever its grammar: not counted
    engine.generate(prompt, {"regex": "[0-9]", "max_new_tokens": 1})
    first_token, whole = [], []
    for i in range(variants):
        cold = latency(schema_variant(2 * i), 1)
        first_token.append(cold - latency(schema_variant(2 * i), 1))
        cold = latency(schema_variant(2 * i + 1), MAX_NEW_TOKENS)
        whole.append(cold - latency(schema_variant(2 * i + 1), MAX_NEW_TOKENS))
    return {"compile_s": statistics.median(first_token), "first_output_extra_s": statistics.median(whole),
            "compile_s_each": first_token, "first_output_extra_s_each": whole}  # fmt: skip


def run_config(settings: dict, n: int, dtype: str, rounds: int, batches: list[int], variants: int) -> dict:
    params = {"json_schema": SCHEMA, "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}
    with langrt.Engine(log_level="warning", max_total_tokens=32768, dtype=dtype, **settings) as engine:
        prompts = chat_prompts(engine.tokenizer, n)
        cost = first_request_cost(engine, prompts[0], variants)
        engine.generate(prompts, params)  # warm-up: the grammar, its masks, the drafts' spellings
        by_batch = {}
        for batch in batches:
            runs = []
            for _ in range(rounds):
                engine.flush_cache()
                runs.append(timed(engine, prompts, params, batch))
            median = sorted(runs, key=lambda r: r["output_tok_s"])[len(runs) // 2]
            texts = [t for r in runs for t in r["texts"]]
            by_batch[str(batch)] = {
                **{k: v for k, v in median.items() if k != "texts"},
                "best_output_tok_s": max(r["output_tok_s"] for r in runs),
                "valid_outputs": count_valid(median["texts"]),
                "valid_all_rounds": f"{count_valid(texts)}/{len(texts)}",
                "sample_output": median["texts"][0],
            }
    return {"settings": settings, **cost, "by_batch": by_batch}


def add_ratios(results: dict) -> None:
    """Each config's output tok/s over langrt's (as served and token by token), per batch: of
    the median rounds, and of the best rounds (the configs run one after another on a shared
    machine, and other work only ever slows a round down)."""
    for name, result in results["configs"].items():
        for batch, row in result["by_batch"].items():
            for base in ("langrt", "langrt_token_by_token"):
                if base in results["configs"]:
                    other = results["configs"][base]["by_batch"][batch]
                    row[f"tok_s_vs_{base}"] = row["output_tok_s"] / other["output_tok_s"]
                    row[f"best_tok_s_vs_{base}"] = row["best_output_tok_s"] / other["best_output_tok_s"]


def report(results: dict) -> None:
    for name, result in results["configs"].items():
        print(f"{name}: compile {result['compile_s'] * 1000:.0f} ms before the first token, "
              f"{result['first_output_extra_s'] * 1000:.0f} ms more for the first whole output")  # fmt: skip
        for batch, row in result["by_batch"].items():
            ratio, best = row.get("tok_s_vs_langrt", float("nan")), row.get("best_tok_s_vs_langrt", float("nan"))
            print(f"  batch {batch:>2}: {row['output_tok_s']:6.1f} tok/s median ({ratio:.2f}x langrt), {row['best_output_tok_s']:6.1f} best "
                  f"({best:.2f}x), {row['forward_passes']} passes, valid {row['valid_outputs']}/{results['requests']} "
                  f"(all rounds {row['valid_all_rounds']})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 documents, waves of 1 and 4, one round")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--batches", default=None, help="comma-separated requests per wave (default 1,4,16; --quick: 1,4)"
    )
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"some of {', '.join(CONFIGS)}")
    args = parser.parse_args()
    n = 4 if args.quick else 16
    batches = [int(b) for b in (args.batches or ("1,4" if args.quick else "1,4,16")).split(",")]
    rounds, variants = (1, 1) if args.quick else (3, 5)
    results = {"requests": n, "dtype": args.dtype, "rounds": rounds, "schema_variants": variants, "configs": {}}
    for name in args.configs.split(","):
        print(f"{name} ...", flush=True)
        results["configs"][name] = run_config(CONFIGS[name], n, args.dtype, rounds, batches, variants)
    add_ratios(results)
    report(results)
    out = (
        Path(RESULTS)
        / f"bench_grammar_backends{'_quick' if args.quick else ''}{'' if args.dtype == 'auto' else '_' + args.dtype}.json"
    )
    write_results(out, results, dtype=args.dtype)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
