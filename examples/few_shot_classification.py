"""Few-shot classification with `select`: each review is scored against every label in one
prefill-only request; the shared few-shot prefix is cached once for the whole batch.

    .venv/bin/python examples/few_shot_classification.py                 # launches the built-in model
    .venv/bin/python examples/few_shot_classification.py --url http://127.0.0.1:30000 --quick
"""

from __future__ import annotations

import argparse
import time

import langrt_frontend as sgl

LABELS = ["positive", "negative"]
EXAMPLES = [
    ("I loved every minute of it, wonderful acting.", "positive"),
    ("A boring, predictable waste of two hours.", "negative"),
    ("Beautiful music and a story that made me smile.", "positive"),
    ("The plot made no sense and the jokes fell flat.", "negative"),
]
REVIEWS = [
    ("An absolute delight from start to finish.", "positive"),
    ("Terrible. I walked out halfway through.", "negative"),
    ("Great cast, great script, I would watch it again.", "positive"),
    ("Dull characters and an awful ending.", "negative"),
    ("Charming, funny and full of heart.", "positive"),
    ("Poorly filmed and far too long.", "negative"),
]


@sgl.function
def classify(s, review):
    s += "Classify the sentiment of each movie review.\n\n"
    for text, label in EXAMPLES:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += f"Review: {review}\nSentiment: " + sgl.select("label", choices=LABELS)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running langrt server (default: launch one with the built-in model)")
    parser.add_argument("--quick", action="store_true", help="two reviews (CI)")
    args = parser.parse_args(argv)
    reviews = REVIEWS[:2] if args.quick else REVIEWS
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    try:
        start = time.perf_counter()
        states = classify.run_batch([{"review": r} for r, _ in reviews], backend=backend)
        elapsed = time.perf_counter() - start
        correct = 0
        for (review, expected), state in zip(reviews, states):
            if state.error() is not None:
                raise SystemExit(f"error: {state.error()}")
            scores = state.get_meta_info("label")["normalized_prompt_logprobs"]
            correct += state["label"] == expected
            print(f"{state['label']:>8}  (expected {expected}; scores {[round(x, 2) for x in scores]})  {review}")
        print(f"accuracy {correct}/{len(reviews)} in {elapsed:.1f} s")
    finally:
        if isinstance(backend, sgl.Runtime):
            backend.shutdown()


if __name__ == "__main__":
    main()
