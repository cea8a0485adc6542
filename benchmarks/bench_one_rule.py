"""Why small schemas stay one regex DFA: bench_json's schema compiled as one regex DFA (the path
kept for schemas that neither recurse nor grow big) vs the same regex as a one-rule pushdown
automaton, side by side: compile time, each mask of a valid instance's walk the first time
(fresh states) and again (memoized). Writes results/bench_one_rule.json.

    .venv/bin/python benchmarks/bench_one_rule.py
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from bench_json import SCHEMA

from langrt.builtin import builtin_model_path
from langrt.constrained import GrammarCompiler, allocate_token_bitmask
from langrt.constrained.cfg.rules import RuleSet
from langrt.constrained.json_schema import schema_to_grammar
from langrt.tokenizer.loader import load_tokenizer
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
INSTANCE = {"name": "Ada Lovelace", "age": 36, "city": "London", "occupation": "mathematician",
            "email": "ada@example.com", "employed": True, "languages": ["English", "French"]}  # fmt: skip


def measure(make, ids, compiler, rounds: int = 5) -> dict:
    compile_s, fresh, cached = [], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        grammar = make()
        compile_s.append(time.perf_counter() - start)
        for times in (fresh, cached):
            matcher, bitmask = grammar.matcher(), allocate_token_bitmask(1, compiler.vocab_size)
            for token in ids:
                start = time.perf_counter()
                matcher.fill_bitmask(bitmask, 0)
                times.append(time.perf_counter() - start)
                assert matcher.accept_token(token)
    return {"compile_ms_min": min(compile_s) * 1e3, "fresh_mask_us_p50": statistics.median(fresh) * 1e6,
            "cached_mask_us_p50": statistics.median(cached) * 1e6}  # fmt: skip


def main() -> None:
    path = builtin_model_path()
    compiler, tokenizer = GrammarCompiler.from_pretrained(path), load_tokenizer(path)
    regex = schema_to_grammar(SCHEMA)
    ids = tokenizer.encode(json.dumps(INSTANCE))
    rows = {
        "regex DFA": measure(lambda: compiler.compile_regex(regex), ids, compiler),
        "one-rule PDA": measure(
            lambda: compiler._grammar(RuleSet(["root"], [regex]), regex, "json_schema"), ids, compiler
        ),
    }
    for name, r in rows.items():
        print(f"{name:13} compile {r['compile_ms_min']:7.1f} ms   first mask p50 {r['fresh_mask_us_p50']:7.1f} us   "
              f"memoized p50 {r['cached_mask_us_p50']:5.1f} us")  # fmt: skip
    write_results(RESULTS / "bench_one_rule.json", rows)


if __name__ == "__main__":
    main()
