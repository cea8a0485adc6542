"""JSON-schema extraction with and without jump-forward, side by side (built-in model, greedy).

Documents (seeded templates) are turned into a JSON object following one schema, sent in waves
of 1, 4 and 16 requests. Reports output tok/s, forward passes and the ratios for each, and
checks the outputs are identical (jump-forward only saves passes) and valid against the schema.
Also what a pass costs: tokens computed per pass and seconds per pass with and without the
drafts (the speed-up is the pass ratio over the pass cost ratio), the share of drafts kept, and
the tokens output with no pass at all (an output's certain end, like the `}` after its last
value).

    .venv/bin/python benchmarks/bench_json.py [--quick] [--dtype float32] [--batches 1,16] [--ngram] [--avx2]

`--ngram`: the jump-forward side also drafts by n-grams (`speculative_algorithm="NGRAM"`: values
copied from the document), to show what the two give together against token by token; results
then go to bench_json_ngram.json. `--avx2`: the whole run as an AVX2-only CPU runs it (torch, oneDNN
and MKL capped at AVX2, so langrt's kernels take their AVX2 paths; `--dtype auto` is then
float32); results go to bench_json_avx2.json.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import jsonschema

import langrt
from langrt.cpu_features import fast_bf16
from bench_offline import cpu_flags_summary, run_capped_at_avx2
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30},
        "occupation": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "employed": {"type": "boolean"},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "occupation", "email", "employed", "languages"],
    "additionalProperties": False,
}
FIRST = ["Alice", "Bruno", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana", "Ivan", "Jules"]
LAST = ["Moreau", "Silva", "Wang", "Okafor", "Novak", "Haddad", "Berg", "Tanaka", "Petrov", "Klein"]
CITIES = ["Lyon", "Porto", "Chengdu", "Lagos", "Brno", "Beirut", "Bergen", "Osaka", "Kazan", "Graz"]
JOBS = ["nurse", "civil engineer", "baker", "data analyst", "teacher", "pilot", "chemist", "architect"]
LANGS = ["English", "French", "Portuguese", "Mandarin", "Yoruba", "Czech", "Arabic", "Japanese"]


def documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        langs = rng.sample(LANGS, 2)
        docs.append(
            f"{first} {last} is a {rng.randint(22, 70)}-year-old {rng.choice(JOBS)} living in {rng.choice(CITIES)}. "
            f"{first} speaks {langs[0]} and {langs[1]}, is currently {'employed' if rng.random() < 0.7 else 'looking for work'}, "
            f"and can be reached at {first.lower()}.{last.lower()}@example.com."
        )
    return docs


def chat_prompts(tokenizer, n: int) -> list[str]:
    """The workload's prompts: each of `n` documents with the extraction request, in the chat
    template."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Extract the person's details as JSON.\n\n{doc}"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for doc in documents(n)
    ]


def run_waves(engine, prompts: list[str], params: dict, batch: int, counters: tuple[str, ...]) -> tuple[list, dict]:
    """The prompts in waves of `batch` requests (each wave one generate call): (outputs, a row
    with the texts, seconds, output tok/s and how much each cache_stats counter grew)."""
    before = engine.cache_stats()
    start = time.perf_counter()
    outs = [o for i in range(0, len(prompts), batch) for o in engine.generate(prompts[i : i + batch], params)]
    seconds = time.perf_counter() - start
    after = engine.cache_stats()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    row = {
        "texts": [o["text"] for o in outs],
        "seconds": seconds,
        "output_tokens": tokens,
        "output_tok_s": tokens / seconds,
    }
    return outs, {**row, **{k: after[k] - before[k] for k in counters}}


def timed(engine, prompts: list[str], params: dict, batch: int) -> dict:
    counters = ("forward_passes", "forward_tokens", "drafted_tokens", "jump_forward_tokens", "spec_accepted_tokens",
                "certain_tail_tokens")  # fmt: skip
    return run_waves(engine, prompts, params, batch, counters)[1]


def run_both(
    prompts: list[str], max_tokens: int, dtype: str, rounds: int, batches: list[int], on_args: dict | None = None
) -> dict[int, tuple[dict, dict]]:
    """Both engines up at once, rounds alternating which goes first (this machine is shared:
    interleaving keeps a noisy minute from landing on one side); each side's median round,
    for each batch size (5 rounds: the 16-request wave takes ~2 s, and single rounds of it
    vary by several percent)."""
    params = {"json_schema": SCHEMA, "max_new_tokens": max_tokens, "temperature": 0}
    common = dict(log_level="warning", max_total_tokens=32768, dtype=dtype)
    results = {}
    with (
        langrt.Engine(**common, **(on_args or {})) as on_engine,
        langrt.Engine(**common, disable_jump_forward=True) as off_engine,
    ):
        engines = {"on": on_engine, "off": off_engine}
        for engine in engines.values():
            # warm-up: the whole workload once, so that first-use work (compiling the grammar,
            # each state's token mask, the spellings drafts learn) is out of the timed rounds
            engine.generate(prompts, params)
        for batch in batches:
            runs = {"on": [], "off": []}
            for r in range(rounds):
                for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                    engines[side].flush_cache()
                    runs[side].append(timed(engines[side], prompts, params, batch))
            median = lambda rs: sorted(rs, key=lambda x: x["output_tok_s"])[len(rs) // 2]  # noqa: E731
            results[batch] = median(runs["on"]), median(runs["off"])
    return results


def count_valid(texts: list[str]) -> int:
    valid = 0
    for text in texts:
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            valid += 1
        except (json.JSONDecodeError, jsonschema.ValidationError):
            pass
    return valid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on this CPU) or float32: bf16 matmuls are not batch-invariant "
                        "here, so jump-forward's different batches can flip a near-tie; float32 shows the outputs identical")  # fmt: skip
    parser.add_argument(
        "--batches", default=None, help="comma-separated requests per wave (default 1,4,16; --quick: 1,4)"
    )
    parser.add_argument("--ngram", action="store_true", help="n-gram drafts too on the jump-forward side")
    parser.add_argument("--avx2", action="store_true", help="run everything as an AVX2-only CPU does")
    args = parser.parse_args()
    if args.avx2:
        run_capped_at_avx2()
    n = 4 if args.quick else 16
    batches = [int(b) for b in (args.batches or ("1,4" if args.quick else "1,4,16")).split(",")]
    with langrt.Engine(log_level="warning", max_total_tokens=4096) as probe:
        prompts = chat_prompts(probe.tokenizer, n)
    on_args = {"speculative_algorithm": "NGRAM"} if args.ngram else {}
    measured = run_both(prompts, 160, args.dtype, 1 if args.quick else 5, batches, on_args)
    results = {
        "requests": n, "dtype": args.dtype, "auto_dtype": "bfloat16" if fast_bf16() else "float32", "avx2": args.avx2,
        "cpu_flags": cpu_flags_summary(),
        "jump_forward_side": {"jump_forward": True, **on_args}, "by_batch": {},
    }  # fmt: skip
    for batch, (on, off) in measured.items():
        row = {
            "identical_outputs": on["texts"] == off["texts"],
            "identical_count": sum(a == b for a, b in zip(on["texts"], off["texts"])),
            "valid_outputs": count_valid(on["texts"]),
            "valid_outputs_without": count_valid(off["texts"]),
            "jump_forward": {k: v for k, v in on.items() if k != "texts"},
            "token_by_token": {k: v for k, v in off.items() if k != "texts"},
            "speedup_output_tok_s": on["output_tok_s"] / off["output_tok_s"],
            "pass_ratio": off["forward_passes"] / on["forward_passes"],
            # what a pass costs with the drafts' rows in it, against one without
            "tokens_per_pass": [
                on["forward_tokens"] / on["forward_passes"],
                off["forward_tokens"] / off["forward_passes"],
            ],
            "pass_cost_ratio": (on["seconds"] / on["forward_passes"]) / (off["seconds"] / off["forward_passes"]),
            "drafts_kept": (on["jump_forward_tokens"] + on["spec_accepted_tokens"]) / max(1, on["drafted_tokens"]),
        }
        results["by_batch"][str(batch)] = row
        print(f"batch {batch:2d}: jump-forward {on['output_tok_s']:6.1f} tok/s, {on['forward_passes']} passes "
              f"({on['jump_forward_tokens']} jump-forward drafts kept{', %d n-gram' % on['spec_accepted_tokens'] if args.ngram else ''}, "
              f"{on['certain_tail_tokens']} certain ends output without a pass) | without {off['output_tok_s']:6.1f} tok/s, "
              f"{off['forward_passes']} passes | {row['speedup_output_tok_s']:.2f}x tok/s, {row['pass_ratio']:.2f}x fewer passes; "
              f"identical {row['identical_count']}/{n}; valid {row['valid_outputs']}/{n}")  # fmt: skip
        print(f"          tokens computed per pass {row['tokens_per_pass'][0]:.1f} vs {row['tokens_per_pass'][1]:.1f}, "
              f"a pass {row['pass_cost_ratio']:.2f}x as long; {on['drafted_tokens']} drafts, {row['drafts_kept']:.0%} kept")  # fmt: skip
    results["sample_output"] = measured[batches[0]][0]["texts"][0]
    print("sample:", results["sample_output"])
    suffix = (
        ("_ngram" if args.ngram else "")
        + ("_avx2" if args.avx2 else "")
        + ("_quick" if args.quick else "")
        + ("" if args.dtype == "auto" else "_" + args.dtype)
    )
    out = RESULTS / f"bench_json{suffix}.json"
    write_results(out, results, dtype=args.dtype)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
