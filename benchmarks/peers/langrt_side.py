"""langrt in a benchmark worker: a langrt.Engine (its scheduler and detokenizer processes are the
worker's children, so the worker's process tree is all of langrt)."""

from __future__ import annotations

import time
from typing import Iterator


class LangrtSide:
    def __init__(self, model: str | None, threads: int, ctx: int, dtype: str, quantization: str):
        import langrt  # and no more in this process: torch is imported by the scheduler alone

        self.engine = langrt.Engine(
            model, dtype=dtype, quantization=quantization, max_total_tokens=ctx, num_threads=threads, log_level="warning",
        )  # fmt: skip
        self.system_info = self.engine.get_server_info()["cpu_path"]
        self.version = langrt.__version__
        # langrt's K/V pool holds the model's dtype (float32 on the quantized CPU path)
        self.kv_value_bytes = 4 if self.engine.args.dtype == "float32" else 2

    def flush(self) -> None:
        """Empty the prefix cache (it refuses while requests run: none do between calls)."""
        if not self.engine.flush_cache():
            raise RuntimeError("langrt refused to flush its prefix cache: a request is still running")

    def stream(self, ids: list[int], new_tokens: int) -> Iterator[list[int]]:
        params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        for result in self.engine.generate(input_ids=ids, sampling_params=params, stream=True):
            if result["output_ids"]:
                yield list(result["output_ids"])

    def batch(self, ids_list: list[list[int]], new_tokens: int) -> dict:
        """`ids_list` decoded together: output tok/s of the whole call and the decode step (the
        call's time less a 1-token call's, over the steps after the first), cache flushed before each."""
        params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        self.flush()
        start = time.perf_counter()
        outs = self.engine.generate(input_ids=ids_list, sampling_params=params)
        elapsed = time.perf_counter() - start
        self.flush()
        start = time.perf_counter()
        self.engine.generate(input_ids=ids_list, sampling_params={**params, "max_new_tokens": 1})
        first = time.perf_counter() - start
        tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
        return {"sequences": len(ids_list), "tokens": tokens, "seconds": elapsed, "tok_s": tokens / elapsed,
                "decode_step_ms": 1000 * (elapsed - first) / max(1, new_tokens - 1)}  # fmt: skip

    def tokenize(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode(text, add_special_tokens=False)
