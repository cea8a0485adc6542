"""llama.cpp through llama-cpp-python: in a benchmark worker (LlamaCppSide) and as a server
(`python -m llama_cpp.server`, server_command).

Install: `pip install 'llama-cpp-python[server]'` (builds llama.cpp for this CPU; the build's
instructions are in its system info, recorded with every result).
"""

from __future__ import annotations

import sys
from typing import Iterator


class LlamaCppSide:
    """One model file in llama.cpp, the way its Python users run it (mmap'd, default batch sizes)."""

    def __init__(self, model: str, threads: int, ctx: int):
        import llama_cpp

        self.system_info = llama_cpp.llama_print_system_info().decode()
        self.version = llama_cpp.__version__
        self.kv_value_bytes = 2  # llama.cpp's default K and V types are f16
        self.llm = llama_cpp.Llama(model, n_threads=threads, n_threads_batch=threads, n_ctx=ctx, verbose=False)

    def flush(self) -> None:
        """Forget the tokens evaluated so far. Without this, `generate(reset=True)` still reuses
        the longest prefix it shares with the previous call's tokens (its prompt cache)."""
        self.llm.reset()

    def stream(self, ids: list[int], new_tokens: int) -> Iterator[list[int]]:
        """Greedy; the output ids so far after each token. `generate` does not stop at EOS."""
        out: list[int] = []
        for token in self.llm.generate(ids, temp=0.0, top_k=1, reset=True):
            out.append(int(token))
            yield list(out)
            if len(out) == new_tokens:
                return

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=False, special=True)


def server_command(model: str, port: int, threads: int, ctx: int) -> list[str]:
    """`python -m llama_cpp.server` on `model`. It runs one request at a time under a lock:
    llama-cpp-python's server has no continuous batching and no parallel slots (llama.cpp's own
    `llama-server` has both; servers.py starts either)."""
    return [
        sys.executable, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1", "--port", str(port),
        "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(ctx), "--verbose", "False",
    ]  # fmt: skip
