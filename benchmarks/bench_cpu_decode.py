"""CPU side by side, any model: langrt vs llama.cpp (llama-cpp-python), same file, same threads.

    .venv/bin/python benchmarks/bench_cpu_decode.py --model ~/.cache/langrt-models/qwen2.5-coder-1.5b.gguf
    .venv/bin/python benchmarks/bench_cpu_decode.py                    # the built-in SmolLM2-135M
    .venv/bin/python benchmarks/bench_cpu_decode.py --quick            # a smoke run
    .venv/bin/python benchmarks/bench_cpu_decode.py --variants layer_loop,dequantized

Each engine runs in a process of its own (peers/worker.py), started afresh every round, the
engines alternated (round 2 reverses the order) so drift in the machine's load hits both. Per
round and engine, with the prefix cache flushed (langrt) or the evaluated tokens forgotten
(llama.cpp) before every timed call, and prompts new each round so no cache can carry over:

- start to first answer: process start -> model loaded -> first token of a short prompt;
- resident memory of the engine's whole process tree 3 s after that answer (RSS summed; PSS, which
  counts the pages they share once) and again after the timed calls;
- batch-1 decode of `--new-tokens` greedy tokens (EOS ignored) from a chat prompt: time to the
  first token, then decode tok/s over the tokens after it; the greedy ids of both engines are
  compared (how many leading tokens agree);
- time to first token of a `--prompt-tokens` prompt (the same token ids on both sides);
- langrt only: `--batch` sequences decoded together (llama-cpp-python's API decodes one).

Each figure is also given as a fraction of the machine's limit, measured in the same run
(machine_limits.py): decode as bytes per step (model_cost.py: the file's weights a step reads) x
steps/s / read bandwidth; prompts and batches as FLOPs / s / peak GEMM FLOP/s. `--avx2` caps torch,
oneDNN and MKL at AVX2 for the whole run (langrt's processes inherit it); llama.cpp keeps the
instructions it was built for (its system info, in the results, lists them), so give it a build
for AVX2 with `--llama-cpp DIR` on a CPU with more. Results:
results/bench_cpu_decode_<model>[_avx2][_quick].json, with the commit, CPU, versions and command.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_offline import run_capped_at_avx2  # noqa: E402
from machine_limits import cpu_description, machine_limits, provenance  # noqa: E402
from model_cost import ModelCost, model_cost  # noqa: E402
from peers.host import EngineSpec, Worker  # noqa: E402

from langrt_kernels.cpu import LAYER_DISABLE_ENV  # noqa: E402
from langrt.model.fused_layers import ENV as FUSED_LAYERS_ENV  # noqa: E402

SETTLE_S = 3.0
RESULTS = Path(__file__).parent / "results"
TOPICS = ["the sea", "a robot", "winter", "a small town", "music", "the moon", "a garden", "trains"]

# langrt configurations besides the default (`--variants`): what each switches, and why it is worth a row.
VARIANTS = {
    "layer_loop": EngineSpec("langrt", "langrt_layer_loop", env={FUSED_LAYERS_ENV: "0"}),  # per-layer Python loop
    "torch_layers": EngineSpec(
        "langrt", "langrt_torch_layers", env={LAYER_DISABLE_ENV: "0"}
    ),  # attention, norms in torch
    "dequantized": EngineSpec("langrt", "langrt_dequantized", quantization="none"),  # blocks expanded at load
    "float32": EngineSpec("langrt", "langrt_float32", dtype="float32"),
    "bfloat16": EngineSpec("langrt", "langrt_bfloat16", dtype="bfloat16"),
}


def engine_specs(args) -> list[EngineSpec]:
    specs = [EngineSpec("langrt", "langrt")] + [VARIANTS[v] for v in args.variants]
    env = (
        {"PYTHONPATH": os.pathsep.join(filter(None, [args.llama_cpp, os.environ.get("PYTHONPATH")]))}
        if args.llama_cpp
        else {}
    )
    if args.no_llama_cpp:
        print("--no-llama-cpp: llama.cpp's rows are skipped")
    elif importlib.util.find_spec("llama_cpp") is None:
        print("llama-cpp-python is not installed: its rows are skipped (pip install llama-cpp-python)")
    elif not args.model.endswith(".gguf"):
        print("llama.cpp serves GGUF files only: its rows are skipped for this model")
    else:
        specs.append(EngineSpec("llama_cpp", "llama_cpp", env=env))
    return specs


def chat_ids(tokenizer, text: str) -> list[int]:
    """`text` as a user turn in the model's chat template (plain text where it has none)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    return tokenizer.encode(text, add_special_tokens=False)


def round_prompts(tokenizer, round_no: int, args) -> dict:
    """Prompts of this round only: a new round shares no prefix with an earlier one."""
    story = chat_ids(tokenizer, f"Round {round_no}: write a long story about {TOPICS[round_no % len(TOPICS)]}.")
    text = " ".join(
        f"Report {round_no}, paragraph {i}: the committee met on a rainy Tuesday to discuss the budget."
        for i in range(args.prompt_tokens // 8)
    )
    long_ids = tokenizer.encode(text, add_special_tokens=False)[: args.prompt_tokens]
    batch = [
        chat_ids(tokenizer, f"Round {round_no}, story {i}: write about {TOPICS[i % len(TOPICS)]}.")
        for i in range(args.batch)
    ]
    return {"story": story, "long": long_ids, "batch": batch}


def measure(spec: EngineSpec, prompts: dict, args) -> dict:
    worker = Worker(spec, args.model, args.threads, args.ctx)
    try:
        # Memory once settled: langrt commits its K/V pages and builds the scheduler's tokenizer
        # while idle after the first answer; both engines get the same pause.
        time.sleep(SETTLE_S)
        row = {"start_to_first_answer_s": worker.start_to_first_answer_s, "memory_after_load": worker.memory(),
               "system_info": worker.system_info, "version": worker.version, "kv_value_bytes": worker.kv_value_bytes}  # fmt: skip
        row["decode"] = worker.call(op="decode", ids=prompts["story"], new_tokens=args.new_tokens)
        row["ttft_s"] = worker.call(op="ttft", ids=prompts["long"])["seconds"]
        if spec.engine == "langrt" and prompts["batch"]:
            row["batch"] = worker.call(op="batch", ids_list=prompts["batch"], new_tokens=args.new_tokens)
        row["memory_after_runs"] = worker.memory()
        row["log_tail"] = worker.log_tail(1000)
    finally:
        worker.close()
    return row


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_rounds(specs: list[EngineSpec], tokenizer, args) -> list[dict]:
    rounds = []
    for round_no in range(args.rounds):
        prompts = round_prompts(tokenizer, round_no, args)
        order = specs if round_no % 2 == 0 else specs[::-1]
        rows = {}
        for spec in order:
            rows[spec.name] = row = measure(spec, prompts, args)
            d = row["decode"]
            print(f"round {round_no} {spec.name:20s} start->answer {row['start_to_first_answer_s']:6.1f} s | "
                  f"decode {d['decode_tok_s']:6.1f} tok/s | TTFT {len(prompts['long'])} tokens {row['ttft_s']:6.2f} s | "
                  f"PSS {row['memory_after_load']['pss_bytes'] / 1e9:.2f} GB", flush=True)  # fmt: skip
        if "llama_cpp" in rows:
            ref = rows["llama_cpp"]["decode"]["output_ids"]
            for name, row in rows.items():
                row["greedy_tokens_agreeing_with_llama_cpp"] = common_prefix(row["decode"]["output_ids"], ref)
        rounds.append(
            {"prompt_tokens": {"story": len(prompts["story"]), "long": len(prompts["long"])}, "engines": rows}
        )
    return rounds


def engine_summary(rows: list[dict], cost: ModelCost, limits: dict, prompt_tokens: int, kv_tokens: int) -> dict:
    """Best and median over the rounds, and each best as a fraction of the machine's limit."""
    pick = {
        "decode_tok_s": ([r["decode"]["decode_tok_s"] for r in rows], max),
        "ttft_s": ([r["ttft_s"] for r in rows], min),
        "start_to_first_answer_s": ([r["start_to_first_answer_s"] for r in rows], min),
        "pss_after_load_bytes": ([r["memory_after_load"]["pss_bytes"] for r in rows], min),
        "rss_after_load_bytes": ([r["memory_after_load"]["rss_bytes"] for r in rows], min),
        "pss_after_runs_bytes": ([r["memory_after_runs"]["pss_bytes"] for r in rows], min),
    }
    if all("batch" in r for r in rows):
        pick["batch_tok_s"] = ([r["batch"]["tok_s"] for r in rows], max)
    s = {}
    for key, (values, best) in pick.items():
        s[key], s[key + "_median"] = best(values), statistics.median(values)
    bandwidth, peak = limits["read_bandwidth_gbs"] * 1e9, limits["gemm_peak_gflops"] * 1e9
    s["decode_fraction_of_bandwidth_limit"] = cost.bytes_per_step * s["decode_tok_s"] / bandwidth
    s["ttft_fraction_of_gemm_peak"] = cost.prompt_flops(prompt_tokens) / s["ttft_s"] / peak
    if "batch_tok_s" in s:
        s["batch_fraction_of_gemm_peak"] = cost.flops_per_token * s["batch_tok_s"] / peak
    s["pss_after_load_over_file"] = s["pss_after_load_bytes"] / cost.file_bytes
    if all("kv_value_bytes" in r for r in rows):  # the engine's own K/V pool (its dtype's size)
        s["kv_pool_bytes"] = cost.kv_bytes(kv_tokens, rows[0]["kv_value_bytes"])
        s["pss_after_load_median_over_file_plus_kv"] = s["pss_after_load_bytes_median"] / (
            cost.file_bytes + s["kv_pool_bytes"]
        )
    return s


def ratios(engines: dict) -> dict:
    """langrt against llama.cpp, each ratio > 1 where langrt is ahead (or smaller, for memory)."""
    ours, theirs = engines["langrt"], engines["llama_cpp"]
    out = {}
    for suffix in ("", "_median"):
        out["decode" + suffix] = ours["decode_tok_s" + suffix] / theirs["decode_tok_s" + suffix]
        out["ttft_speedup" + suffix] = theirs["ttft_s" + suffix] / ours["ttft_s" + suffix]
        out["start_to_first_answer_langrt_over_llama_cpp" + suffix] = (
            ours["start_to_first_answer_s" + suffix] / theirs["start_to_first_answer_s" + suffix]
        )
        out["pss_after_load_langrt_over_llama_cpp" + suffix] = (
            ours["pss_after_load_bytes" + suffix] / theirs["pss_after_load_bytes" + suffix]
        )
    return out


def summarize(results: dict, cost: ModelCost) -> dict:
    names = results["rounds"][0]["engines"].keys()
    prompt_tokens = results["rounds"][0]["prompt_tokens"]["long"]
    limits, kv_tokens = results["limits"], results["settings"]["ctx"]
    engines = {
        n: engine_summary([r["engines"][n] for r in results["rounds"]], cost, limits, prompt_tokens, kv_tokens)
        for n in names
    }
    summary = {"engines": engines}
    if "llama_cpp" in engines:
        summary["langrt_vs_llama_cpp"] = ratios(engines)
    return summary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default=None, help="a GGUF file or an HF directory (default: the built-in SmolLM2-135M)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="both engines' threads (default: this process's cores)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32, help="langrt's batched-decode row (0: none)")
    parser.add_argument(
        "--ctx",
        type=int,
        default=4096,
        help="KV capacity in tokens, both engines (langrt's --max-total-tokens, llama.cpp's n_ctx)",
    )
    parser.add_argument("--variants", default="", help=f"extra langrt rows, comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--no-llama-cpp", action="store_true", help="langrt's rows only")
    parser.add_argument("--quick", action="store_true", help="1 round, 16 tokens, a 200-token prompt, batch 8")
    parser.add_argument(
        "--avx2", action="store_true", help="cap torch, oneDNN and MKL at AVX2 (langrt); see --llama-cpp"
    )
    parser.add_argument(
        "--llama-cpp", metavar="DIR", help="import llama-cpp-python from DIR (pip install --target DIR ...)"
    )
    parser.add_argument(
        "--out", default=None, help="results JSON (default: results/bench_cpu_decode_<model>[_avx2][_quick].json)"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.new_tokens, args.prompt_tokens, args.batch = 1, 16, 200, min(args.batch, 8)
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2: decode speed is timed over the tokens after the first")
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants {','.join(unknown)}: not one of {', '.join(VARIANTS)}")
    if args.model is None:
        from langrt.builtin import builtin_model_path

        args.model = str(builtin_model_path())
    args.model = str(Path(args.model).expanduser().resolve())
    if args.llama_cpp:
        args.llama_cpp = str(Path(args.llama_cpp).resolve())
        sys.path.insert(0, args.llama_cpp)
    return args


def main() -> None:
    args = parse_args()
    if args.avx2:
        run_capped_at_avx2()
    import torch

    from langrt.tokenizer.loader import load_tokenizer

    torch.set_num_threads(args.threads)
    model_path = Path(args.model)
    cost = model_cost(model_path)
    results = {
        **provenance(), **cpu_description(), "model": str(model_path), "cost": vars(cost),
        "settings": {k: getattr(args, k) for k in ("threads", "rounds", "new_tokens", "prompt_tokens", "batch", "ctx", "variants", "avx2")},
        "kv_pool_bytes_float16": cost.kv_bytes(args.ctx, 2), "limits": machine_limits(),
    }  # fmt: skip
    print(f"{results['cpu_model']} {results['cpu_flags']}, {args.threads} threads, load {results['load_average']}; "
          f"read {results['limits']['read_bandwidth_gbs']:.1f} GB/s, GEMM {results['limits']['gemm_peak_gflops']:.0f} GFLOP/s", flush=True)  # fmt: skip
    results["rounds"] = run_rounds(engine_specs(args), load_tokenizer(model_path), args)
    results["engines_info"] = {
        n: {"system_info": r["system_info"], "version": r["version"]}
        for n, r in results["rounds"][0]["engines"].items()
    }
    if "llama_cpp" in results["engines_info"]:  # the version the worker imported (--llama-cpp DIR, say)
        results["llama_cpp_python"] = results["engines_info"]["llama_cpp"]["version"]
    results["load_average_after"] = list(os.getloadavg())
    results["summary"] = summarize(results, cost)
    print(json.dumps(results["summary"], indent=2))
    RESULTS.mkdir(exist_ok=True)
    stem = model_path.stem if model_path.is_file() else model_path.name
    out = (
        Path(args.out)
        if args.out
        else RESULTS / f"bench_cpu_decode_{stem}{'_avx2' if args.avx2 else ''}{'_quick' if args.quick else ''}.json"
    )
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
