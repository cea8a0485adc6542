"""JSON-schema extraction over a batch of documents: `run_batch` runs one program per document
concurrently (the runtime batches them), and constrained decoding makes every output valid JSON.

    .venv/bin/python examples/json_extraction.py                 # launches the built-in model
    .venv/bin/python examples/json_extraction.py --url http://127.0.0.1:30000 --quick
"""

from __future__ import annotations

import argparse
import json
import time

import langrt_frontend as sgl

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "city": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "city", "age"],
    "additionalProperties": False,
}

DOCUMENTS = [
    "Maria Lopez, 34, moved to Madrid last spring to open a bakery.",
    "At 52, Tom Becker still runs the family garage in Hamburg.",
    "Aiko Tanaka (27) works as a nurse in Osaka.",
    "The Lyon chess club welcomed its youngest member, Louis Martin, aged 9.",
    "Retired teacher Grace Okafor, 71, volunteers at a library in Lagos.",
    "Priya Nair, a 45-year-old engineer, commutes daily in Bangalore.",
]


@sgl.function
def extract(s, document, max_tokens):
    s += sgl.system("Extract the person described in the text as JSON with keys name, city and age.")
    s += sgl.user(document)
    s += sgl.assistant(sgl.gen("record", max_tokens=max_tokens, json_schema=SCHEMA))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running langrt server (default: launch one with the built-in model)")
    parser.add_argument("--quick", action="store_true", help="two documents (CI)")
    args = parser.parse_args(argv)
    documents = DOCUMENTS[:2] if args.quick else DOCUMENTS
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    try:
        start = time.perf_counter()
        states = extract.run_batch(
            [{"document": d, "max_tokens": 64} for d in documents],
            temperature=0,
            backend=backend,
            progress_bar=not args.quick,
        )
        elapsed = time.perf_counter() - start
        for document, state in zip(documents, states):
            if state.error() is not None:
                raise SystemExit(f"error: {state.error()}")
            record = json.loads(state["record"])
            print(f"{document}\n  -> {record}")
        print(f"{len(documents)} documents in {elapsed:.1f} s")
    finally:
        if isinstance(backend, sgl.Runtime):
            backend.shutdown()


if __name__ == "__main__":
    main()
