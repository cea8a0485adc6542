"""Long prompts at batch 1, side by side in one run: langrt vs llama.cpp (llama-cpp-python, same
GGUF, same threads), and langrt with its CPU attention taking long rows whole (as before segments).

For prompts of 1,000, 2,000 and 4,000 tokens (the built-in model, greedy, EOS ignored): the time
to the first token, then decode speed over the next 128 tokens (tokens after the first over the time
they took, as they stream), each from an empty cache. A decode step reads the whole KV cache once per layer (4,000
tokens: 92 MB in bfloat16, as much as the weights), so decode slows as the context grows;
langrt's attention splits a decode's keys into 512-key segments that threads take separately
(kernels/cpu/paged_attention.cpp), where before a row's keys for one KV head were one thread's
work (SmolLM2 has 3 KV heads: on 2 threads one idled a third of the time).
`LANGRT_CPU_ATTENTION_SEGMENTS=0` runs the "unsegmented" side.

Systems take turns within each repeat (the machine is shared: a noisy minute lands on all).

    .venv/bin/python benchmarks/bench_long_context.py            # 1,000 / 2,000 / 4,000 tokens, 3 repeats
    .venv/bin/python benchmarks/bench_long_context.py --quick    # 1,000 tokens, 1 repeat

Needs `pip install llama-cpp-python` for its rows (skipped without it).
Results: results/bench_long_context[_quick].json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_offline import cpu_flags_summary  # noqa: E402

import langrt  # noqa: E402
from langrt.builtin import builtin_model_path  # noqa: E402

from langrt_kernels.cpu import SEGMENTS_ENV  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
NEW_TOKENS = 128


def engine_with_env(env: dict[str, str], **kwargs) -> langrt.Engine:
    """A langrt.Engine (log level warning) whose processes start with `env` added to this one's
    environment (they inherit it); this process's environment is left as it was."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return langrt.Engine(log_level="warning", **kwargs)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def long_prompt_ids(tokenizer, n: int) -> list[int]:
    text = " ".join(f"Paragraph {i}: the committee met on a rainy Tuesday to discuss the budget." for i in range(n))
    return tokenizer.encode(text, add_special_tokens=False)[:n]


class Langrt:
    def __init__(self, name: str, env: dict[str, str]):
        self.name = name
        self.engine = engine_with_env(env, max_total_tokens=16384)
        self.tokenizer = self.engine.tokenizer

    def measure(self, ids: list[int]) -> tuple[float, float]:
        """(time to the first token, decode tok/s after it), from an empty cache, streamed."""
        self.engine.flush_cache()
        params = {"max_new_tokens": NEW_TOKENS + 1, "temperature": 0, "ignore_eos": True}
        start = time.perf_counter()
        first = None
        for chunk in self.engine.generate(input_ids=ids, sampling_params=params, stream=True):
            made, now = chunk["meta_info"]["completion_tokens"], time.perf_counter()
            if first is None:
                first, first_made = now - start, made
        return first, (made - first_made) / (now - start - first)


class LlamaCpp:
    name = "llama_cpp"

    def __init__(self, threads: int):
        import llama_cpp

        # e.g. "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 0 | ...": the instructions this build uses
        self.system_info = llama_cpp.llama_print_system_info().decode()
        self.llm = llama_cpp.Llama(
            str(builtin_model_path()), n_threads=threads, n_threads_batch=threads, n_ctx=8192, verbose=False
        )

    def measure(self, ids: list[int]) -> tuple[float, float]:
        """As langrt's: from an empty cache (reset: `generate` would reuse the last prompt's KV)."""
        llm = self.llm
        llm.reset()
        start = time.perf_counter()
        for made, _ in enumerate(llm.generate(ids, temp=0.0, reset=True), start=1):
            if made == 1:
                first = time.perf_counter() - start
            if made == NEW_TOKENS + 1:
                break
        return first, NEW_TOKENS / (time.perf_counter() - start - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 tokens, one repeat")
    args = parser.parse_args()
    lengths, repeats = ((1000,), 1) if args.quick else ((1000, 2000, 4000), 3)
    threads = torch.get_num_threads()
    systems = [Langrt("langrt", {}), Langrt("langrt_unsegmented", {SEGMENTS_ENV: "0"})]
    try:
        systems.append(LlamaCpp(threads))
    except ImportError:
        print("llama-cpp-python is not installed: its rows are skipped (pip install llama-cpp-python)")
    prompts = {n: long_prompt_ids(systems[0].tokenizer, n) for n in lengths}
    for system in systems:  # warm-up: first-use work out of the timed runs
        system.measure(prompts[lengths[0]][:200])
    runs = {n: {s.name: [] for s in systems} for n in lengths}
    for _ in range(repeats):
        for n in lengths:
            for system in systems:
                runs[n][system.name].append(system.measure(prompts[n]))
    results = {"threads": threads, "cpu_flags": cpu_flags_summary(), "new_tokens": NEW_TOKENS, "by_prompt": {}}
    for n in lengths:
        row = {}
        for name, measured in runs[n].items():
            row[name] = {
                "ttft_s": min(m[0] for m in measured),
                "decode_tok_s": max(m[1] for m in measured),
                "runs": measured,
            }
        for name in list(runs[n]):
            if name != "langrt":
                row[f"decode_langrt_over_{name}"] = row["langrt"]["decode_tok_s"] / row[name]["decode_tok_s"]
                row[f"ttft_{name}_over_langrt"] = row[name]["ttft_s"] / row["langrt"]["ttft_s"]
        results["by_prompt"][str(n)] = row
        print(f"{n:5d}-token prompt: " + " | ".join(
            f"{name} TTFT {row[name]['ttft_s']:.3f} s, decode {row[name]['decode_tok_s']:.1f} tok/s" for name in runs[n]
        ), flush=True)  # fmt: skip
    for system in systems:
        if isinstance(system, Langrt):
            system.engine.shutdown()
    out = RESULTS / f"bench_long_context{'_quick' if args.quick else ''}.json"
    write_results(out, results)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
