"""Offline generation speed: langrt.Engine vs HF transformers `generate`, side by side.

Same model (the built-in SmolLM2-135M-Instruct GGUF), same prompts, same output lengths (EOS
ignored), greedy. transformers loads the GGUF as its users would (it keeps the weights packed and
dequantizes inside its matmuls); it runs in bf16 and in fp32 (which it recommends for packed
GGUF), and the faster of the two is the baseline. Reports output tok/s at batch 1 and batch 32,
the ratios, and langrt's batch-1 decode as a fraction of the memory-bandwidth limit (weights
read once per step), with the bandwidth measured in this run.

    .venv/bin/python benchmarks/bench_offline.py            # full
    .venv/bin/python benchmarks/bench_offline.py --quick    # a smoke run
    .venv/bin/python benchmarks/bench_offline.py --avx2     # as an AVX2-only CPU runs

`--avx2` caps torch, oneDNN and MKL at AVX2 for the whole run (langrt's children and transformers
alike), so an AVX-512 machine measures the path an AVX2-only CPU takes: the C++ kernels off and
float32, the dtype `--dtype auto` picks there. The baseline is then transformers in float32 only:
torch routes bf16 matmuls to oneDNN after asking the CPU itself (not ONEDNN_MAX_CPU_ISA), so a bf16
figure taken here would not be what an AVX2 CPU gets. Results go to bench_offline_avx2.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import torch

import langrt
from langrt.builtin import builtin_model_path
from langrt.cpu_features import describe_path
from results_meta import write_results

RESULTS = Path(__file__).parent / "results"
# What an AVX2-only CPU runs, forced on this one (see langrt.cpu_features).
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def run_capped_at_avx2() -> None:
    """Start this script again with AVX2_ENV set, unless it is set already: torch reads the
    capability once, at start (the children the run starts inherit the cap)."""
    if any(os.environ.get(k) != v for k, v in AVX2_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_ENV})


TOPICS = ["the sea", "a robot", "winter", "a small town", "music", "the moon", "a garden", "trains"]


def prompts(tokenizer, n: int, round_: int = 0) -> list[str]:
    """n chat prompts; each `round_` gets its own (the round is in every prompt's text), so a
    timed round never finds a prompt of an earlier round in any cache."""
    return [
        tokenizer.apply_chat_template(
            [
                {
                    "role": "user",
                    "content": f"Write a long story about {TOPICS[i % len(TOPICS)]} (#{i}, round {round_}).",
                }
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(n)
    ]


def measure_bandwidth_gbs() -> float:
    """Read bandwidth of this machine now: summing a 512 MB tensor, best of 5."""
    x = torch.ones(128 * 1024 * 1024, dtype=torch.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best / 1e9


class LangrtRunner:
    name = "langrt"

    def __init__(self, dtype: str):
        self.engine = langrt.Engine(dtype=dtype, log_level="warning", max_total_tokens=65536)
        self.tokenizer = self.engine.tokenizer

    def generate(self, texts: list[str], new_tokens: int) -> int:
        params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        outs = self.engine.generate(texts, params)
        return sum(o["meta_info"]["completion_tokens"] for o in outs)

    def flush(self) -> None:
        """Empty the radix cache and every draft source's, so a timed run computes its prompts
        as transformers does (it keeps nothing between calls)."""
        if not self.engine.flush_cache():
            raise RuntimeError("flush_cache refused: requests still running; the timed run would reuse their KV")


class HFRunner:
    def __init__(self, dtype: str):
        self.name = f"hf_{dtype}"
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = builtin_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=getattr(torch, dtype))
        self.model.eval()

    @torch.inference_mode()
    def generate(self, texts: list[str], new_tokens: int) -> int:
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = self.model.generate(
            **enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
            pad_token_id=self.tokenizer.pad_token_id,
        )  # fmt: skip
        return (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]


Texts = list[str] | Callable[[int], list[str]]


def _round_texts(texts: Texts, round_: int) -> list[str]:
    return texts(round_) if callable(texts) else texts


def _flushed_seconds(runner, texts: list[str], new_tokens: int) -> tuple[int, float]:
    """(tokens, seconds) of one generate after the runner's caches were emptied (runners that
    keep KV between calls, langrt's radix cache and llama.cpp's last prompt, have `flush`)."""
    flush = getattr(runner, "flush", None)
    if flush is not None:
        flush()
    start = time.perf_counter()
    tokens = runner.generate(texts, new_tokens)
    return tokens, time.perf_counter() - start


def timed(runner, texts: Texts, new_tokens: int, repeats: int) -> dict:
    """The best of `repeats` rounds. Every timed generate starts from empty caches, and where
    `texts` is a function of the round each round has prompts no earlier round saw."""
    runner.generate(_round_texts(texts, -1)[:1], 4)  # warm-up, on prompts no round uses
    best = None
    for round_ in range(repeats):
        batch = _round_texts(texts, round_)
        tokens, elapsed = _flushed_seconds(runner, batch, new_tokens)
        # Prefill + first token, to separate decode speed from prompt processing.
        _, first = _flushed_seconds(runner, batch, 1)
        run = {"tokens": tokens, "seconds": elapsed, "tok_s": tokens / elapsed, "first_token_s": first,
               "decode_step_ms": 1000 * (elapsed - first) / (new_tokens - 1)}  # fmt: skip
        best = run if best is None or run["tok_s"] > best["tok_s"] else best
    return best


def cpu_flags_summary() -> list[str]:
    """The CPU's flags that decide langrt's path (which CPU the figures came from)."""
    from langrt.cpu_features import cpu_flags

    return sorted(
        f for f in cpu_flags() if f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16")
    )


def kernels_isa() -> str:
    from langrt_kernels.cpu import isa

    return isa()


def kernels_off() -> str | None:
    from langrt_kernels.cpu import unavailable_reason

    return unavailable_reason()


def model_weight_bytes(dtype: str) -> int:
    """Bytes of the built-in model's weights in `dtype` (read once per decode step)."""
    from langrt.model.source import ModelSource

    c = ModelSource.resolve(None).model_config()
    per_layer = (
        c.hidden_size * (c.q_size + 2 * c.kv_size) + c.q_size * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    )
    params = c.num_layers * per_layer + c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return params * (2 if dtype == "bfloat16" else 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short outputs, one repeat")
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float32"], help="langrt's (default: bfloat16; float32 with --avx2)"
    )
    parser.add_argument("--avx2", action="store_true", help="run everything as an AVX2-only CPU does")
    parser.add_argument(
        "--batches", default="1,32", help="comma-separated batch sizes (batch 1 is needed for the bandwidth figure)"
    )
    args = parser.parse_args()
    if "1" not in args.batches.split(","):
        parser.error("--batches must include 1: the bandwidth figure is batch 1's decode step")
    if args.avx2:
        run_capped_at_avx2()
    args.dtype = args.dtype or ("float32" if args.avx2 else "bfloat16")
    new_tokens = 16 if args.quick else 128
    repeats = 1 if args.quick else 2
    torch.set_num_threads(torch.get_num_threads())

    ours = LangrtRunner(args.dtype)
    weight_bytes = model_weight_bytes(args.dtype)
    baselines = [HFRunner(dtype) for dtype in (("float32",) if args.avx2 else ("bfloat16", "float32"))]
    bandwidth = measure_bandwidth_gbs()
    results = {"dtype": args.dtype, "new_tokens": new_tokens, "bandwidth_gbs": bandwidth,
               "weight_bytes": weight_bytes, "machine": platform.processor() or platform.machine(),
               "threads": torch.get_num_threads(), "cpu_flags": cpu_flags_summary(),
               "cpu_path": describe_path(args.dtype, kernels_off(), kernels_isa()), "batches": {}}  # fmt: skip
    print(results["cpu_path"], flush=True)
    for batch in [int(b) for b in args.batches.split(",")]:
        texts = lambda round_, batch=batch: prompts(ours.tokenizer, batch, round_)  # noqa: E731
        row = {runner.name: timed(runner, texts, new_tokens, repeats) for runner in (ours, *baselines)}
        best_hf = max((r.name for r in baselines), key=lambda name: row[name]["tok_s"])
        row["baseline"] = best_hf
        row["speedup"] = row["langrt"]["tok_s"] / row[best_hf]["tok_s"]
        # Decode alone: each side's step time, its own prefill (first_token_s) left out.
        row["decode_step_speedup"] = row[best_hf]["decode_step_ms"] / row["langrt"]["decode_step_ms"]
        results["batches"][str(batch)] = row
        hf_cols = " | ".join(f"{r.name} {row[r.name]['tok_s']:7.1f} tok/s" for r in baselines)
        print(f"batch {batch:>2}: langrt {row['langrt']['tok_s']:7.1f} tok/s | {hf_cols} | langrt/{best_hf} "
              f"{row['speedup']:.2f}x | decode step langrt {row['langrt']['decode_step_ms']:.1f} ms, "
              f"{best_hf} {row[best_hf]['decode_step_ms']:.1f} ms", flush=True)  # fmt: skip
    limit_steps = bandwidth * 1e9 / weight_bytes
    step_ms = results["batches"]["1"]["langrt"]["decode_step_ms"]
    results["batch1_decode_fraction_of_bandwidth_limit"] = (1000 / step_ms) / limit_steps
    print(f"bandwidth {bandwidth:.1f} GB/s, weights {weight_bytes / 1e6:.0f} MB -> limit {limit_steps:.0f} steps/s; "
          f"langrt batch-1 decode {1000 / step_ms:.1f} steps/s = "
          f"{results['batch1_decode_fraction_of_bandwidth_limit']:.0%} of the limit")  # fmt: skip
    out = RESULTS / f"bench_offline{'_avx2' if args.avx2 else ''}{'_quick' if args.quick else ''}.json"
    write_results(out, results, dtype=args.dtype)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
