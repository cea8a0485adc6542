"""Multi-step analysis: key points -> analysis -> summary, each step a `gen` that sees the
conversation so far (the runtime's prefix cache makes the repeated context free).

    .venv/bin/python examples/multi_step_analysis.py                 # launches the built-in model
    .venv/bin/python examples/multi_step_analysis.py --url http://127.0.0.1:30000 --quick
"""

from __future__ import annotations

import argparse

import langrt_frontend as sgl

TOPIC = "Why do cities plant trees along their streets?"
# Each later answer starts with words of its own: a small model asked a follow-up often repeats
# its previous answer word for word, and an opening steers it to the step's own job.
OPENERS = {"key_points": "", "analysis": "The most important point is", "summary": "In short,"}


@sgl.function
def analyze(s, topic, step_tokens):
    s += sgl.system("You are a concise analyst. Answer in short sentences.")
    s += sgl.user(f"Topic: {topic}\nList three key points.")
    s += sgl.assistant(sgl.gen("key_points", max_tokens=step_tokens))
    s += sgl.user("Which of these points matters most, and why?")
    s += sgl.assistant(OPENERS["analysis"] + sgl.gen("analysis", max_tokens=step_tokens))
    s += sgl.user("Summarise everything in one sentence.")
    s += sgl.assistant(OPENERS["summary"] + sgl.gen("summary", max_tokens=step_tokens))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running langrt server (default: launch one with the built-in model)")
    parser.add_argument("--quick", action="store_true", help="short outputs (CI)")
    parser.add_argument("--topic", default=TOPIC)
    args = parser.parse_args(argv)
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    try:
        state = analyze.run(topic=args.topic, step_tokens=12 if args.quick else 160, temperature=0, backend=backend)
        for step in ("key_points", "analysis", "summary"):
            meta = state.get_meta_info(step)
            text = (OPENERS[step] + state[step]).strip()
            print(f"== {step} ({meta['completion_tokens']} tokens, {meta['cached_tokens']} cached)\n{text}\n")
        if state.error() is not None:
            raise SystemExit(f"error: {state.error()}")
    finally:
        if isinstance(backend, sgl.Runtime):
            backend.shutdown()


if __name__ == "__main__":
    main()
