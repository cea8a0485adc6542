"""A multi-step langrt program on the built-in model (SmolLM2-135M-Instruct), in-process.

    .venv/bin/python examples/quickstart.py
    .venv/bin/python examples/quickstart.py --url http://127.0.0.1:30000   # a running server

The program is SGLang's language (`@function`, `gen`, `select`, `fork`), imported as
`langrt_frontend`; the runtime keeps every prefix it has seen as KV cache, so each step reuses
the conversation so far (see `cached_tokens`).
"""

from __future__ import annotations

import argparse
import time

import langrt_frontend as sgl


@sgl.function
def travel_guide(s, city, max_tokens):
    s += sgl.user(f"What country is {city} in?")
    s += sgl.assistant(sgl.gen("country", max_tokens=max_tokens, stop="."))
    s += sgl.user(f"Which river flows through {city}?")
    s += sgl.assistant(sgl.select("river", choices=["The Seine", "The Thames", "The Danube"]))
    s += sgl.user(f"Name two things to see in {city}.")
    forks = s.fork(2)  # two suggestions sampled in parallel, batched by the runtime
    forks += sgl.assistant(sgl.gen("sight", max_tokens=max_tokens, temperature=0.7, stop="\n"))
    forks.join()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running langrt server (default: the built-in model, in-process)")
    parser.add_argument("--quick", action="store_true", help="short outputs (CI)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.EngineBackend(log_level="warning")
    print(f"runtime ready in {time.perf_counter() - start:.1f} s")
    try:
        start = time.perf_counter()
        state = travel_guide.run(city="Paris", max_tokens=12 if args.quick else 48, temperature=0, backend=backend)
        if state.error() is not None:
            raise SystemExit(f"error: {state.error()}")
        print(f"country: {state['country'].strip()}")
        scores = [round(x, 2) for x in state.get_meta_info("river")["normalized_prompt_logprobs"]]
        print(f"river:   {state['river']}  (choice scores {scores})")
        for i, sight in enumerate(state["sight"]):
            print(f"sight {i + 1}: {sight.strip()}")
        cached = [state.get_meta_info("country")["cached_tokens"]] + [
            m["cached_tokens"] for m in state.get_meta_info("sight")
        ]
        print(f"program ran in {time.perf_counter() - start:.1f} s; cached prompt tokens per gen: {cached}")
    finally:
        if isinstance(backend, sgl.EngineBackend):
            backend.shutdown()


if __name__ == "__main__":
    main()
