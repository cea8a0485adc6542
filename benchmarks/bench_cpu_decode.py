"""CPU decode, side by side in one run: langrt vs llama.cpp (llama-cpp-python) vs HF transformers.

Same file (the built-in SmolLM2-135M-Instruct, Q4_1 layers and a Q8_0 embedding), same threads,
greedy, EOS ignored. Reports:

- batch 1, 128 new tokens: output tok/s of langrt (its GGUF blocks served as stored, in bfloat16
  and float32 activations, and dequantized as before: `--quantization none`; `_layer_loop`: a
  pass through the per-layer Python loop instead of one C++ call), llama.cpp and HF;
- batch 32, 128 new tokens each: langrt vs HF (llama-cpp-python's API decodes one sequence);
- time to first token of a 1,000-token prompt: langrt vs llama.cpp;
- the CPU's flags, and batch-1 decode as a fraction of the memory-bandwidth limit (the weights'
  bytes read once per step, bandwidth measured in this run) and batch 32 as a fraction of the
  compute peak: float32 FMA (threads x clock x 2 FMA units x 8 lanes x 2 flops), twice that for
  bfloat16 where the CPU has AVX512-BF16 (its dot products multiply pairs).

    .venv/bin/python benchmarks/bench_cpu_decode.py            # full (a few minutes)
    .venv/bin/python benchmarks/bench_cpu_decode.py --quick    # a smoke run
    .venv/bin/python benchmarks/bench_cpu_decode.py --avx2 [--llama-cpp DIR]  # as an AVX2-only CPU runs it

`--avx2` caps torch, oneDNN and MKL at AVX2 for the whole run (the C++ layer kernels then run
their AVX2 build; the quantized kernels are AVX2 code either way), so HF runs as on an AVX2-only
CPU too; langrt also runs with the layer kernels off (`_torch_layers`: attention, norms and rotary
in plain torch, as before they had an AVX2 build), to show what they give there. llama.cpp keeps
the instructions it was built for, and `pip install llama-cpp-python` builds it for this CPU
(AVX-512 here): the AVX2 run takes llama.cpp only from a build for AVX2, given by `--llama-cpp DIR`
(benchmarks/README.md, "The AVX2 path beside peers capped at AVX2", says how to make one; its
system info, recorded with the results, lists the instructions it uses). Needs `pip install
llama-cpp-python` (a few minutes' build); without it, its rows are skipped. Results:
results/bench_cpu_decode[_avx2][_quick].json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_offline import (  # noqa: E402
    HFRunner, LangrtRunner, cpu_flags_summary, measure_bandwidth_gbs, prompts, run_capped_at_avx2, timed,
)  # fmt: skip

import langrt  # noqa: E402
from langrt_kernels.cpu import LAYER_DISABLE_ENV  # noqa: E402
from langrt.cpu_features import fast_bf16  # noqa: E402
from langrt.model.fused_layers import ENV as FUSED_LAYERS_ENV  # noqa: E402
from langrt.builtin import builtin_model_path  # noqa: E402

RESULTS = Path(__file__).parent / "results"


# A variant's name suffix -> the environment its engine runs with (the engine's processes inherit it).
VARIANTS = {
    "": {},
    "_torch_layers": {LAYER_DISABLE_ENV: "0"},  # the quantized products stay; attention, norms, rotary in plain torch
    "_layer_loop": {FUSED_LAYERS_ENV: "0"},  # every pass through the per-layer Python loop
}


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


class QuantLangrtRunner(LangrtRunner):
    def __init__(self, dtype: str, quantization: str, variant: str = ""):
        self.name = f"langrt_{dtype}_{'blocks' if quantization == 'auto' else 'dequantized'}{variant}"
        self.engine = engine_with_env(VARIANTS[variant], dtype=dtype, quantization=quantization, max_total_tokens=65536)
        self.tokenizer = self.engine.tokenizer

    def first_token_seconds(self, ids: list[int]) -> float:
        self.engine.flush_cache()
        start = time.perf_counter()
        self.engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0})
        return time.perf_counter() - start


class LlamaCppRunner:
    name = "llama_cpp"

    def __init__(self, threads: int, n_ctx: int = 4096):
        import llama_cpp
        from llama_cpp import Llama

        # e.g. "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 0 | ...": the instructions this build uses
        self.system_info = llama_cpp.llama_print_system_info().decode()
        self.llm = Llama(str(builtin_model_path()), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, verbose=False)

    def generate(self, texts: list[str], new_tokens: int) -> int:
        """Sequences one after another (the Python API has no batched decoding)."""
        made = 0
        for text in texts:
            tokens = self.llm.tokenize(text.encode(), add_bos=False, special=True)
            for made_here, _ in enumerate(self.llm.generate(tokens, temp=0.0, reset=True), start=1):
                if made_here == new_tokens:
                    break
            made += new_tokens
        return made

    def first_token_seconds(self, ids: list[int]) -> float:
        self.llm.reset()
        start = time.perf_counter()
        next(iter(self.llm.generate(ids, temp=0.0, reset=True)))
        return time.perf_counter() - start


def weight_bytes_and_params() -> tuple[int, int]:
    """(bytes a decode step reads: every tensor of the file as stored, the tied embedding being the
    LM head; the matrices' weights, each 2 flops per token)."""
    from langrt.model.gguf_loader import GGUFFile

    tensors = GGUFFile(builtin_model_path()).tensors.values()
    return sum(t.nbytes for t in tensors), sum(t.shape[0] * t.shape[1] for t in tensors if len(t.shape) == 2)


def fma_peak_gflops(threads: int) -> float:
    """float32 FMA peak: threads x clock x 2 FMA units x 8 lanes x 2 flops (AVX2 width)."""
    mhz = 0.0
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("cpu MHz"):
                mhz = max(mhz, float(line.split(":")[1]))
    return threads * mhz / 1000 * 2 * 8 * 2


def long_prompt_ids(tokenizer, n: int) -> list[int]:
    text = " ".join(f"Paragraph {i}: the committee met on a rainy Tuesday to discuss the budget." for i in range(n))
    return tokenizer.encode(text, add_special_tokens=False)[:n]


def run_langrt(results: dict, args, threads: int) -> None:
    configs = [("bfloat16", "auto", ""), ("bfloat16", "auto", "_layer_loop"), ("float32", "auto", ""), ("bfloat16", "none", "")]
    if args.avx2:
        configs = [("float32", "auto", ""), ("float32", "auto", "_layer_loop"), ("float32", "auto", "_torch_layers"), ("float32", "none", "")]
    for dtype, quantization, variant in configs:
        runner = QuantLangrtRunner(dtype, quantization, variant)
        for batch in (1, 32):
            row = timed(runner, prompts(runner.tokenizer, batch), args.new_tokens, args.repeats)
            results["batches"][str(batch)][runner.name] = row
            print(f"batch {batch:>2} {runner.name:28s} {row['tok_s']:7.1f} tok/s, step {row['decode_step_ms']:.1f} ms", flush=True)
        ids = long_prompt_ids(runner.tokenizer, args.prompt_tokens)
        results["ttft_s"][runner.name] = min(runner.first_token_seconds(ids) for _ in range(args.repeats))
        print(f"TTFT {len(ids)} tokens {runner.name:28s} {results['ttft_s'][runner.name]:.3f} s", flush=True)
        runner.engine.shutdown()


def run_peers(results: dict, args, threads: int) -> None:
    llama = None
    if args.avx2 and not args.llama_cpp:
        print("--avx2 without --llama-cpp DIR: llama.cpp's rows are skipped (its default build uses AVX-512 here)")
    else:
        try:
            llama = LlamaCppRunner(threads)
            results["llama_cpp_system_info"] = llama.system_info
            print(f"llama.cpp: {llama.system_info}", flush=True)
        except ImportError:
            print("llama-cpp-python is not installed: its rows are skipped (pip install llama-cpp-python)")
    if llama is not None:
        texts = prompts(_tokenizer(), 1)
        results["batches"]["1"]["llama_cpp"] = timed(llama, texts, args.new_tokens, args.repeats)
        ids = long_prompt_ids(_tokenizer(), args.prompt_tokens)
        results["ttft_s"]["llama_cpp"] = min(llama.first_token_seconds(ids) for _ in range(args.repeats))
        print(f"batch  1 llama_cpp {results['batches']['1']['llama_cpp']['tok_s']:.1f} tok/s; TTFT {results['ttft_s']['llama_cpp']:.3f} s", flush=True)
        del llama
    for dtype in ("bfloat16", "float32"):
        hf = HFRunner(dtype)
        for batch in (1, 32):
            row = timed(hf, prompts(hf.tokenizer, batch), args.new_tokens, args.repeats)
            results["batches"][str(batch)][hf.name] = row
            print(f"batch {batch:>2} {hf.name:28s} {row['tok_s']:7.1f} tok/s", flush=True)
        del hf


def _tokenizer():
    from langrt.tokenizer.loader import load_tokenizer

    return load_tokenizer(builtin_model_path())


def summarize(results: dict, threads: int) -> None:
    b1, b32 = results["batches"]["1"], results["batches"]["32"]
    # what `--dtype auto` serves here (bfloat16 where the CPU has AVX512-BF16 and torch uses it)
    ours = f"langrt_{results['auto_dtype']}_blocks"
    hf32 = max((k for k in b32 if k.startswith("hf")), key=lambda k: b32[k]["tok_s"], default=None)
    s = results["summary"] = {"langrt_default": ours}
    if "llama_cpp" in b1:
        s["batch1_langrt_over_llama_cpp"] = b1[ours]["tok_s"] / b1["llama_cpp"]["tok_s"]
        s["ttft_llama_cpp_over_langrt"] = results["ttft_s"]["llama_cpp"] / results["ttft_s"][ours]
    if hf32:
        s["batch32_langrt_over_hf"] = b32[ours]["tok_s"] / b32[hf32]["tok_s"]
    for variant in ("_torch_layers", "_layer_loop"):
        if ours + variant in b1:
            s[f"batch1_over{variant}"] = b1[ours]["tok_s"] / b1[ours + variant]["tok_s"]
            s[f"batch32_over{variant}"] = b32[ours]["tok_s"] / b32[ours + variant]["tok_s"]
            s[f"ttft{variant}_over_ours"] = results["ttft_s"][ours + variant] / results["ttft_s"][ours]
    dequantized = ours.replace("blocks", "dequantized")
    if dequantized in b1:
        s["batch1_blocks_over_dequantized"] = b1[ours]["tok_s"] / b1[dequantized]["tok_s"]
    step_s = b1[ours]["decode_step_ms"] / 1000
    s["batch1_fraction_of_bandwidth_limit"] = results["weight_bytes"] / step_s / (results["bandwidth_gbs"] * 1e9)
    # bfloat16 GEMMs on AVX512-BF16 multiply pairs: twice the float32 FMA rate.
    peak = results["fma_peak_gflops"] * (2 if "bfloat16" in ours and "avx512_bf16" in results["cpu_flags"] else 1)
    s["batch32_fraction_of_compute_peak"] = b32[ours]["tok_s"] * results["flops_per_token"] / (peak * 1e9)
    print(json.dumps(s, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short outputs, short prompt, one repeat")
    parser.add_argument("--avx2", action="store_true", help="as an AVX2-only CPU runs it (langrt and HF; llama.cpp with --llama-cpp)")
    parser.add_argument("--llama-cpp", metavar="DIR", help="import llama-cpp-python from DIR (pip install --target DIR ...)")
    args = parser.parse_args()
    if args.llama_cpp:
        sys.path.insert(0, str(Path(args.llama_cpp).resolve()))
    if args.avx2:
        run_capped_at_avx2()
    args.new_tokens, args.repeats, args.prompt_tokens = (16, 1, 200) if args.quick else (128, 2, 1000)
    threads = torch.get_num_threads()
    nbytes, params = weight_bytes_and_params()
    results = {
        "threads": threads, "cpu_flags": cpu_flags_summary(), "new_tokens": args.new_tokens,
        "prompt_tokens": args.prompt_tokens, "bandwidth_gbs": measure_bandwidth_gbs(), "weight_bytes": nbytes,
        "flops_per_token": 2 * params, "fma_peak_gflops": fma_peak_gflops(threads),
        "model": builtin_model_path().name, "batches": {"1": {}, "32": {}}, "ttft_s": {},
        "auto_dtype": "bfloat16" if fast_bf16() else "float32",
    }  # fmt: skip
    print(f"{threads} threads, flags {results['cpu_flags']}, bandwidth {results['bandwidth_gbs']:.1f} GB/s", flush=True)
    run_langrt(results, args, threads)
    run_peers(results, args, threads)
    summarize(results, threads)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench_cpu_decode{'_avx2' if args.avx2 else ''}{'_quick' if args.quick else ''}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
