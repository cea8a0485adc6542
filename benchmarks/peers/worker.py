"""One engine in a process of its own, driven by host.Worker over stdin/stdout (JSON lines).

    python benchmarks/peers/worker.py --engine langrt|llama_cpp --model PATH --threads 2 --ctx 4096

It loads the model, answers a one-token prompt and only then writes its first line ("ready"), so
the host's clock from process start to that line is start-to-first-answer. Then, per line read:
  {"op": "decode", "ids": [...], "new_tokens": 64}   flush, stream greedy tokens: TTFT, decode tok/s
  {"op": "ttft", "ids": [...]}                        flush, one token: seconds
  {"op": "batch", "ids_list": [[...]], "new_tokens"}  (langrt only) batched decode
Replies go to a private copy of stdout; the engine's own prints (and its children's) go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def make_side(args):
    if args.engine == "llama_cpp":
        from llama_cpp_side import LlamaCppSide

        return LlamaCppSide(args.model, args.threads, args.ctx)
    from langrt_side import LangrtSide

    return LangrtSide(args.model, args.threads, args.ctx, args.dtype, args.quantization)


def decode(side, ids: list[int], new_tokens: int) -> dict:
    """Time to the first token, then decode tok/s over the tokens after it (prompt excluded)."""
    side.flush()
    start = time.perf_counter()
    first_at, first_count, out, now = None, 0, [], start
    for out in side.stream(ids, new_tokens):
        now = time.perf_counter()
        if first_at is None:
            first_at, first_count = now, len(out)
    if first_at is None:
        raise RuntimeError("the engine produced no token")
    after_first = len(out) - first_count
    return {"ttft_s": first_at - start, "e2e_s": now - start, "tokens": len(out), "output_ids": out,
            "decode_tok_s": after_first / (now - first_at) if after_first else None}  # fmt: skip


def first_token_seconds(side, ids: list[int]) -> float:
    side.flush()
    start = time.perf_counter()
    next(iter(side.stream(ids, 1)))
    return time.perf_counter() - start


def serve(side, reply) -> None:
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "decode":
            answer = decode(side, cmd["ids"], cmd["new_tokens"])
        elif cmd["op"] == "ttft":
            answer = {"seconds": first_token_seconds(side, cmd["ids"])}
        elif cmd["op"] == "batch":
            answer = side.batch(cmd["ids_list"], cmd["new_tokens"])
        else:
            answer = {"error": f"unknown op {cmd['op']!r}: decode, ttft or batch"}
        reply.write(json.dumps(answer) + "\n")
        reply.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["langrt", "llama_cpp"], required=True)
    parser.add_argument("--model", default=None, help="GGUF file or HF directory; langrt's built-in model if left out")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--ctx", type=int, required=True, help="KV capacity in tokens")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    args = parser.parse_args()
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # everything else printed, here or by children, goes to stderr
    try:
        side = make_side(args)
        next(iter(side.stream(side.tokenize("Hello"), 1)))  # the first answer
        ready = {"ready": True, "system_info": side.system_info, "version": side.version}
        reply.write(json.dumps({**ready, "kv_value_bytes": side.kv_value_bytes}) + "\n")
        reply.flush()
        serve(side, reply)
    except Exception:  # noqa: BLE001 - handed to the host, which raises it with this text
        reply.write(json.dumps({"error": traceback.format_exc()}) + "\n")
        reply.flush()
        raise SystemExit(1)


if __name__ == "__main__":
    main()  # run as a script, this folder is first on sys.path: the sides import by bare name
