"""Grammar engine speed on a corpus of realistic JSON schemas (benchmarks/schemas.py), langrt
side by side with outlines-core's own JSON-schema path, on the built-in model's vocabulary.

Per schema: compile time (schema -> regex -> automaton ready to mask), then a valid instance
(json.dumps) is walked token by token and the time to fill each step's token bitmask is
recorded (first visits of a state included: langrt computes masks lazily). Reports p50/p99 of
both, and checks that every instance is accepted by langrt's matcher.

    .venv/bin/python benchmarks/bench_grammar.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from schemas import instance, schema_corpus  # noqa: E402

from langrt.builtin import builtin_model_path  # noqa: E402
from langrt.constrained.grammar import GrammarCompiler  # noqa: E402
from langrt.constrained.vocab import vocabulary_from_decoder  # noqa: E402
from langrt.tokenizer.text_decoder import load_text_decoder  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def percentile(values, p):
    return float(np.percentile(np.array(values), p)) if values else float("nan")


def run_langrt(schemas, instances, decoder, vocab) -> dict:
    compiler = GrammarCompiler(vocab)
    compile_ms, mask_us, refused, rejected = [], [], 0, 0
    bitmask = torch.zeros((1, vocab.num_words), dtype=torch.int32)
    for schema, text in zip(schemas, instances):
        start = time.perf_counter()
        try:
            grammar = compiler.compile_json_schema(schema)
        except ValueError:
            refused += 1
            continue
        compile_ms.append(1000 * (time.perf_counter() - start))
        matcher = grammar.matcher()
        for token in decoder.encode(text) + [decoder.eos_token_id]:
            start = time.perf_counter()
            matcher.fill_bitmask(bitmask, 0)
            mask_us.append(1e6 * (time.perf_counter() - start))
            if not matcher.accept_token(token):
                rejected += 1
                break
    return summarize(compile_ms, mask_us) | {"refused": refused, "instances_rejected": rejected}


# outlines-core's eager Index over the whole vocabulary took 17 GB on one schema of this corpus
# (the kernel killed the benchmark): its side runs in a worker process with an address-space
# limit, restarted after a schema that exhausts it (counted as failed).
OUTLINES_MEMORY_LIMIT = 8 << 30
_OC: dict = {}


def _outlines_worker_init(token_bytes, eos_token_id, limit):
    import resource

    from outlines_core import Vocabulary

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    table: dict[bytes, list[int]] = {}
    for i, b in enumerate(token_bytes):
        if b:
            table.setdefault(b, []).append(i)
    _OC["vocab"], _OC["words"] = Vocabulary(eos_token_id, table), (len(token_bytes) + 31) // 32


def _outlines_one(schema_json: str, tokens: list[int]):
    """(compile ms, [mask us]) for one schema, or an error string."""
    from outlines_core import Guide, Index
    from outlines_core.json_schema import build_regex_from_schema

    start = time.perf_counter()
    try:
        index = Index(build_regex_from_schema(schema_json), _OC["vocab"])
    except Exception as e:  # noqa: BLE001 - counted as failed
        return f"{type(e).__name__}: {e}"[:200]
    compile_ms = 1000 * (time.perf_counter() - start)
    guide, mask, masks = Guide(index), torch.zeros(_OC["words"], dtype=torch.int32), []
    for token in tokens:
        start = time.perf_counter()
        guide.write_mask_into(mask.data_ptr(), mask.numel(), 4)
        masks.append(1e6 * (time.perf_counter() - start))
        try:
            guide.advance(token, return_tokens=False)
        except Exception:  # noqa: BLE001 - a tokenization its regex does not take
            break
    return compile_ms, masks


def run_outlines(schemas, instances, decoder, vocab, budget_s: float) -> dict:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    init = (vocab.token_bytes, decoder.eos_token_id, OUTLINES_MEMORY_LIMIT)
    context = multiprocessing.get_context("spawn")
    make = lambda: ProcessPoolExecutor(1, mp_context=context, initializer=_outlines_worker_init, initargs=init)  # noqa: E731
    pool = make()
    compile_ms, mask_us, failed, out_of_memory, done = [], [], 0, 0, 0
    deadline = time.monotonic() + budget_s
    for schema, text in zip(schemas, instances):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        done += 1
        try:
            result = pool.submit(_outlines_one, json.dumps(schema), decoder.encode(text)).result(timeout=remaining)
        except BrokenProcessPool:
            out_of_memory += 1
            pool = make()
            continue
        except TimeoutError:
            done -= 1  # unfinished when the budget ran out
            break
        if isinstance(result, str):
            failed += 1
            continue
        compile_ms.append(result[0])
        mask_us.extend(result[1])
    processes = list((pool._processes or {}).values())  # a schema still compiling past the budget
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()
    return summarize(compile_ms, mask_us) | {"failed": failed, "out_of_memory": out_of_memory, "schemas_run": done}


def summarize(compile_ms, mask_us) -> dict:
    return {
        "schemas": len(compile_ms),
        "compile_ms_p50": percentile(compile_ms, 50),
        "compile_ms_p99": percentile(compile_ms, 99),
        "compile_ms_max": max(compile_ms) if compile_ms else float("nan"),
        "mask_us_p50": percentile(mask_us, 50),
        "mask_us_p99": percentile(mask_us, 99),
        "mask_steps": len(mask_us),
        "mean_compile_ms": statistics.mean(compile_ms) if compile_ms else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--outlines-budget", type=float, default=600.0, help="seconds for the outlines-core side")
    args = parser.parse_args()
    n = 20 if args.quick else 220
    schemas = schema_corpus(n)
    rng = random.Random(0)
    instances = [json.dumps(instance(s, rng)) for s in schemas]
    decoder = load_text_decoder(builtin_model_path())
    vocab = vocabulary_from_decoder(decoder, 49152, {decoder.eos_token_id})
    results = {"schemas": n, "vocabulary": "SmolLM2 (49,152)"}
    results["langrt"] = run_langrt(schemas, instances, decoder, vocab)
    print("langrt  ", json.dumps(results["langrt"]), flush=True)
    results["outlines_core"] = run_outlines(
        schemas, instances, decoder, vocab, 30.0 if args.quick else args.outlines_budget
    )
    print("outlines", json.dumps(results["outlines_core"]), flush=True)
    for side in ("langrt", "outlines_core"):
        r = results[side]
        print(f"{side:14s} compile p50 {r['compile_ms_p50']:8.2f} ms  p99 {r['compile_ms_p99']:9.2f} ms | "
              f"mask p50 {r['mask_us_p50']:7.1f} us  p99 {r['mask_us_p99']:8.1f} us  ({r['schemas']} schemas)")  # fmt: skip
    out = RESULTS / f"bench_grammar{'_quick' if args.quick else ''}.json"
    write_results(out, results)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
