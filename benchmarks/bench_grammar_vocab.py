"""Grammar mask times against the vocabulary's size: the same JSON schemas (benchmarks/schemas.py,
as bench_grammar.py runs them) over the built-in SmolLM2's 49,152 tokens, Qwen2.5's 151,936 and
Gemma 3's 262,144 (SentencePiece, from the GGUF files benchmarks/fetch_models.py assembles;
a model whose file is absent is skipped).

Per vocabulary: the time to build langrt's TokenVocabulary, then per schema the compile time and,
walking a valid instance token by token (the vocabulary's own tokenization), the time to fill
each step's bitmask; p50 / p99 beside the grammar engine's targets (benchmarks/README.md:
compile p50 <= 10 ms, p99 <= 1 s; mask p50 <= 15 us, p99 <= 500 us). One thread; the
vocabularies take turns schema by schema.

    .venv/bin/python benchmarks/bench_grammar_vocab.py [--schemas 60]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_grammar import summarize  # noqa: E402
from fetch_models import MODELS, is_complete, model_path  # noqa: E402
from schemas import instance, schema_corpus  # noqa: E402

from langrt.builtin import builtin_model_path  # noqa: E402
from langrt.constrained.grammar import GrammarCompiler  # noqa: E402
from langrt.constrained.vocab import vocabulary_from_pretrained  # noqa: E402
from langrt.tokenizer.text_decoder import load_text_decoder  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TARGETS = {"compile_ms_p50": 10.0, "compile_ms_p99": 1000.0, "mask_us_p50": 15.0, "mask_us_p99": 500.0}


def vocabularies() -> dict[str, Path]:
    found = {"SmolLM2 (built-in)": builtin_model_path()}
    for name, label in (("qwen2.5-coder-0.5b", "Qwen2.5"), ("gemma3-270m", "Gemma 3")):
        path = model_path(name)
        if is_complete(path, MODELS[name].size):
            found[label] = path
        else:
            print(f"skipping {label}: {path} absent (python benchmarks/fetch_models.py {name})")
    return found


class Side:
    """One vocabulary's compiler and the timings gathered on it."""

    def __init__(self, path: Path):
        start = time.perf_counter()
        self.vocab = vocabulary_from_pretrained(path)
        self.build_s = time.perf_counter() - start
        self.decoder = load_text_decoder(path)
        self.compiler = GrammarCompiler(self.vocab)
        self.bitmask = torch.zeros((1, self.vocab.num_words), dtype=torch.int32)
        self.compile_ms: list[float] = []
        self.mask_us: list[float] = []
        self.rejected = self.refused = 0

    def run(self, schema: dict, text: str) -> None:
        """Compile `schema`, then walk `text` (the vocabulary's own tokens, then EOS), timing each mask."""
        start = time.perf_counter()
        try:
            matcher = self.compiler.compile_json_schema(schema).matcher()
        except ValueError:  # a schema the compiler refuses (none in this corpus so far)
            self.refused += 1
            return
        self.compile_ms.append(1000 * (time.perf_counter() - start))
        for token in self.decoder.encode(text) + [self.decoder.eos_token_id]:
            start = time.perf_counter()
            matcher.fill_bitmask(self.bitmask, 0)
            self.mask_us.append(1e6 * (time.perf_counter() - start))
            if not matcher.accept_token(token):
                self.rejected += 1
                return

    def result(self) -> dict:
        summary = summarize(self.compile_ms, self.mask_us)
        counts = {"refused": self.refused, "instances_rejected": self.rejected}
        return {"vocab_size": self.vocab.vocab_size, "vocabulary_build_s": self.build_s, **summary, **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemas", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    schemas = schema_corpus(args.schemas)
    rng = random.Random(0)
    instances = [json.dumps(instance(s, rng)) for s in schemas]
    sides = {label: Side(path) for label, path in vocabularies().items()}
    # Schema by schema, every vocabulary in turn: a spell of load from other processes on a
    # shared machine then falls on all of them alike, so their ratios hold where totals do not.
    for schema, text in zip(schemas, instances):
        for side in sides.values():
            side.run(schema, text)
    results: dict = {"schemas": args.schemas, "targets": TARGETS}
    for label, side in sides.items():
        r = results[label] = side.result()
        print(
            f"{label:20s} {r['vocab_size']:7d} tokens | vocabulary {r['vocabulary_build_s']:5.1f} s | compile p50 "
            f"{r['compile_ms_p50']:7.2f} ms p99 {r['compile_ms_p99']:8.1f} ms | mask p50 {r['mask_us_p50']:6.1f} us "
            f"p99 {r['mask_us_p99']:7.1f} us | rejected {r['instances_rejected']}",
            flush=True,
        )
    out = RESULTS / "bench_grammar_vocab.json"
    write_results(out, results)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
