"""Fork and vote: sample several candidate answers in parallel forks, then let the model pick
the best one with `select` (and compare with a plain majority vote).

    .venv/bin/python examples/fork_and_vote.py                 # launches the built-in model
    .venv/bin/python examples/fork_and_vote.py --url http://127.0.0.1:30000 --quick
"""

from __future__ import annotations

import argparse
from collections import Counter

import langrt_frontend as sgl

QUESTION = "Name the largest planet in the solar system. Answer with one word."


@sgl.function
def fork_and_vote(s, question, n, max_tokens):
    s += sgl.user(question)
    s += sgl.assistant_begin()
    forks = s.fork(n)
    forks += sgl.gen("candidate", max_tokens=max_tokens, temperature=0.8, stop=["\n", "."])
    forks.join()  # s["candidate"]: the n answers, in fork order
    s += sgl.assistant_end()
    candidates = [c.strip() or "(empty)" for c in s["candidate"]]
    s += sgl.user("Which of these answers is correct? " + ", ".join(candidates))
    s += sgl.assistant("The correct answer is " + sgl.select("best", choices=candidates))
    return candidates


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running langrt server (default: launch one with the built-in model)")
    parser.add_argument("--quick", action="store_true", help="three short candidates (CI)")
    parser.add_argument("--question", default=QUESTION)
    args = parser.parse_args(argv)
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    try:
        n, max_tokens = (3, 6) if args.quick else (5, 16)
        state = fork_and_vote.run(question=args.question, n=n, max_tokens=max_tokens, backend=backend)
        if state.error() is not None:
            raise SystemExit(f"error: {state.error()}")
        candidates = state.ret_value
        print("candidates:", candidates)
        print("majority vote:", Counter(candidates).most_common(1)[0][0])
        print("model's vote:", state["best"])
    finally:
        if isinstance(backend, sgl.Runtime):
            backend.shutdown()


if __name__ == "__main__":
    main()
