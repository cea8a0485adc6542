"""A streaming chat: with `stream=True`, `text_iter` yields the reply as it is generated.

.venv/bin/python examples/streaming_chat.py                 # launches the built-in model
.venv/bin/python examples/streaming_chat.py --interactive   # type your own turns
.venv/bin/python examples/streaming_chat.py --url http://127.0.0.1:30000 --quick
"""

from __future__ import annotations

import argparse

import langrt_frontend as sgl

TURNS = ["Hi! Who are you?", "Give me one tip for learning a new language.", "Thanks, and one more?"]


@sgl.function
def chat_turn(s, history, message, max_tokens):
    for user_text, assistant_text in history:
        s += sgl.user(user_text) + sgl.assistant(assistant_text)
    s += sgl.user(message)
    s += sgl.assistant(sgl.gen("reply", max_tokens=max_tokens))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running langrt server (default: launch one with the built-in model)")
    parser.add_argument("--quick", action="store_true", help="one short turn (CI)")
    parser.add_argument("--interactive", action="store_true", help="read your turns from stdin")
    args = parser.parse_args(argv)
    turns = TURNS[:1] if args.quick else TURNS
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    history: list[tuple[str, str]] = []
    try:
        for message in _messages(args.interactive, turns):
            print(f"you> {message}\nbot> ", end="", flush=True)
            state = chat_turn.run(
                history=history, message=message, max_tokens=16 if args.quick else 200, stream=True, backend=backend
            )
            pieces = []
            for piece in state.text_iter("reply"):
                pieces.append(piece)
                print(piece, end="", flush=True)
            print()
            if state.error() is not None:
                raise SystemExit(f"error: {state.error()}")
            print(f"   [{len(pieces)} streamed pieces]")
            history.append((message, "".join(pieces)))
    finally:
        if isinstance(backend, sgl.Runtime):
            backend.shutdown()


def _messages(interactive: bool, turns: list[str]):
    if not interactive:
        yield from turns
        return
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            return
        if line:
            yield line


if __name__ == "__main__":
    main()
