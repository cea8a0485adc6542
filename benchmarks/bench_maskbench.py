"""MaskBench side by side: langrt's grammar engine, xgrammar, llguidance and outlines-core on one
sample of MaskBench's real-world JSON schemas, over one vocabulary (--vocab: the built-in
SmolLM2's 49k tokens, Qwen2.5's 151k or Gemma 3's 262k; maskbench/vocabs.py).

MaskBench is the folder maskbench/data of github.com/guidance-ai/jsonschemabench: ~11k schemas,
each with valid and invalid instances (format: maskbench/data.py). That repository states no
licence, so nothing of it is copied here: pass its data folder with --data.

Per schema and engine, in one worker process per engine (maskbench/worker.py; killed and
restarted when it passes a time limit or dies, so a hung compile cannot stall the run):
- compile: the engine raising, or passing --compile-timeout, counts as refused;
- every instance, serialised as MaskBench's runner does (json.dumps(data, ensure_ascii=False):
  one line, ", " and ": " separators, properties in the data's order), tokenized without special
  tokens, is walked token by token: the next-token mask is filled (timed) and the token must be
  in it, then accepted; after the last token EOS must be in the mask. (MaskBench's runner stops
  at the last token; the EOS check also rejects an invalid instance that is a prefix of a valid
  one, such as 1 for {"enum": [10]}.)
A schema passes when it compiles, every valid instance is accepted and no invalid one is.
Schemas without instances (~13% of MaskBench) are not sampled. Engines run one at a time, one
thread each, with MaskBench's settings (maskbench/engines.py).

    .venv/bin/python benchmarks/bench_maskbench.py --data PATH/maskbench/data            # 300 schemas
    .venv/bin/python benchmarks/bench_maskbench.py --data PATH/maskbench/data --limit 30 --engines langrt,llguidance
    .venv/bin/python benchmarks/bench_maskbench.py --data PATH/maskbench/data --seed 2 --vocab gemma3   # a second sample

Like-for-like pairs are set side by side where both engines ran (results.PAIRS): langrt's default
(closed objects, schema order) with xgrammar's strict mode, langrt-any (open objects, any order)
with xgrammar-compliant (its non-strict mode). Seed 0 is the sample langrt was tuned on; report
another seed beside it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from benchmarks.maskbench.data import Case, sample_cases  # noqa: E402
from benchmarks.maskbench.engines import DEFAULT_ENGINES, DISTRIBUTIONS, MODULES  # noqa: E402
from benchmarks.maskbench.results import (  # noqa: E402
    Decode,
    EngineResult,
    format_pairs,
    format_reasons,
    format_table,
    pair_rows,
    summarize,
)
from benchmarks.maskbench.run_meta import run_meta  # noqa: E402
from benchmarks.maskbench.vocabs import VOCABS, load_vocab_tokenizer, vocab_label  # noqa: E402
from benchmarks.maskbench.worker import EngineUnavailable, EngineWorker, Limits  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data", type=Path, required=True, help="MaskBench's data folder (jsonschemabench/maskbench/data)"
    )
    engines = f"comma list of {', '.join(MODULES)} (default: those of the first four installed)"
    parser.add_argument("--engines", default=",".join(DEFAULT_ENGINES), help=engines)
    parser.add_argument(
        "--sample", type=int, default=300, help="schemas to draw (with instances, spread across sources)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (0: the one langrt was tuned on)")
    parser.add_argument("--vocab", default="smollm2", choices=sorted(VOCABS), help="the tokenizer every engine uses")
    parser.add_argument("--limit", type=int, help="draw this many schemas instead of --sample (a quick run)")
    parser.add_argument("--out", type=Path, help="default: results/bench_maskbench[_VOCAB][_seedN].json")
    parser.add_argument(
        "--compile-timeout", type=float, default=30.0, help="seconds; past it the schema counts as refused"
    )
    parser.add_argument(
        "--walk-timeout", type=float, default=120.0, help="seconds for one schema's instances; past it the schema fails"
    )
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address-space limit per worker (0: none)")
    parser.add_argument("--progress-every", type=int, default=10, help="print progress every N schemas")
    args = parser.parse_args(argv)
    if args.out is None:
        suffix = ("" if args.vocab == "smollm2" else f"_{args.vocab}") + ("" if args.seed == 0 else f"_seed{args.seed}")
        args.out = RESULTS / f"bench_maskbench{suffix}.json"
    return args


def chosen_engines(spec: str) -> list[str]:
    """The engines asked for that are installed; the others are reported and skipped."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        raise SystemExit(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    missing = [n for n in names if importlib.util.find_spec(MODULES[n]) is None]
    for name in missing:
        print(f"{name}: not installed (pip install {DISTRIBUTIONS[MODULES[name]]}), skipped", flush=True)
    return [n for n in names if n not in missing]


def versions(engines: list[str]) -> dict[str, str]:
    found = {}
    for name in engines:
        try:
            found[name] = importlib.metadata.version(DISTRIBUTIONS[MODULES[name]])
        except importlib.metadata.PackageNotFoundError:
            found[name] = "unknown"
    return found


def start_workers(names: list[str], limits: Limits, log: BinaryIO) -> dict[str, EngineWorker]:
    workers = {}
    for name in names:
        worker = EngineWorker(name, limits, log)
        try:
            worker.start()
        except EngineUnavailable as e:
            print(f"{name}: unavailable ({e}), skipped", flush=True)
            continue
        workers[name] = worker
    return workers


def run_cases(
    cases: list[Case], workers: dict[str, EngineWorker], decode: Decode, every: int
) -> dict[str, list[EngineResult]]:
    """Each schema through every engine in turn (one at a time: timings without contention)."""
    results: dict[str, list[EngineResult]] = {name: [] for name in workers}
    start = time.monotonic()
    for i, case in enumerate(cases, 1):
        for name, worker in workers.items():
            results[name].append(worker.run(case, decode))
        if i % every == 0 or i == len(cases):
            passing = ", ".join(f"{n} {sum(r.status == 'pass' for r in rs)}" for n, rs in results.items())
            print(f"[{i}/{len(cases)}] {time.monotonic() - start:.0f} s; passing: {passing}", flush=True)
    return results


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; returns the report it also writes to args.out."""
    engines = chosen_engines(args.engines)
    tokenizer = load_vocab_tokenizer(args.vocab)
    args.vocab_label = vocab_label(args.vocab, tokenizer)
    args.load_before = os.getloadavg()
    cases = sample_cases(
        args.data, args.limit or args.sample, args.seed, lambda text: tokenizer.encode(text, add_special_tokens=False)
    )
    print(
        f"{len(cases)} schemas from {args.data} ({len({c.source for c in cases})} sources); engines: {', '.join(engines)}",
        flush=True,
    )
    # the engines' own warnings (xgrammar logs one per keyword it approximates) go to a file
    log_path = Path(tempfile.gettempdir()) / f"bench_maskbench-workers-{os.getpid()}.log"
    print(f"engines' stderr: {log_path}", flush=True)
    with open(log_path, "wb") as log:
        workers = start_workers(
            engines, Limits(args.compile_timeout, args.walk_timeout, args.memory_gb, args.vocab), log
        )
        try:
            results = run_cases(cases, workers, tokenizer.decode, args.progress_every)
        finally:
            for worker in workers.values():
                worker.stop()
    return report(args, cases, results)


def report(args: argparse.Namespace, cases: list[Case], results: dict[str, list[EngineResult]]) -> dict:
    summaries = {name: summarize(rs) for name, rs in results.items()}
    print(format_table(summaries))
    if pairs := format_pairs(summaries):
        print(pairs)
    if "langrt" in summaries:
        print(format_reasons("langrt", summaries["langrt"]))
    rows = [
        {
            "id": c.id,
            "source": c.source,
            "valid": sum(i.valid for i in c.instances),
            "invalid": sum(not i.valid for i in c.instances),
        }
        | {"engines": {name: rs[k].row() for name, rs in results.items()}}
        for k, c in enumerate(cases)
    ]
    settings = {
        "data": str(args.data),
        "schemas": len(cases),
        "seed": args.seed,
        "compile_timeout_s": args.compile_timeout,
    }
    settings |= {
        "walk_timeout_s": args.walk_timeout,
        "versions": versions(list(results)),
        "vocabulary": args.vocab_label,
    }
    settings |= {"tuning_sample": args.seed == 0, "meta": run_meta(args.load_before)}
    out = {"settings": settings, "engines": summaries, "pairs": pair_rows(summaries), "schemas": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return out


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
