"""The Triton GPU path against the memory-bandwidth limit.

1. Decode attention (kernels/decode_attention.py) on Llama-3-8B's attention shape (32 query
   heads, 8 KV heads, head dim 128, bfloat16) over a paged pool whose slots are shuffled, for
   several batch sizes and context lengths. Achieved bandwidth = bytes the kernel must read (K,
   V and the req_to_token entries; q and out are noise) / median time with a cold L2 cache
   (triton.testing.do_bench flushes it), as a fraction of the GPU's peak HBM bandwidth and of
   the measured copy bandwidth.
2. Batch-1 decode of a Llama-3-8B-shape model with dummy weights (bfloat16) through ModelRunner,
   after a prompt of --context tokens: wall time of one step as the scheduler runs it (batch
   build, forward, logits, greedy argmax), against the bandwidth limit: every weight read once
   (the embedding table excepted) plus the sequence's KV, at the measured copy bandwidth (and at
   the data-sheet peak). Three ways: --attention-backend triton with CUDA graphs (the default on
   CUDA), triton without (--disable-cuda-graph), and torch.
3. The grammar bitmask kernel (kernels/grammar_bitmask.py) on 64 rows of a 128,256-token
   vocabulary (Llama 3's), half the tokens allowed: time per call, and bytes moved (the packed
   mask read, the banned logits written) over time, beside torch's masked_fill_ with the mask
   already unpacked to bools (what a kernel-less path does at best).

Peak bandwidth: --peak-gbs, else the memory clock and bus width torch reports, else a table of
known GPUs' data-sheet figures; the measured device-to-device copy bandwidth (bytes read +
written) is the practical ceiling. Results (with the GPU's name) go to --out, by default
benchmarks/results/bench_kernels.json (bench_kernels_quick.json with --quick).

    .venv/bin/python benchmarks/bench_kernels.py            # full
    .venv/bin/python benchmarks/bench_kernels.py --quick    # a smoke run

Needs a CUDA GPU (and about 20 GB of its memory); without one it exits with a message.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"

LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": 128000,
    "eos_token_id": 128001,
}  # fmt: skip

# Data-sheet HBM bandwidth (GB/s), first match on the device name wins.
KNOWN_PEAKS = [
    (("H200",), 4800), (("H100", "NVL"), 3900), (("H100", "PCIe"), 2000), (("H100",), 3350),
    (("A100", "80GB", "PCIe"), 1935), (("A100", "80GB"), 2039), (("A100",), 1555),
    (("L40S",), 864), (("L4",), 300), (("A10",), 600), (("4090",), 1008),
]  # fmt: skip


def peak_bandwidth_gbs(override: float | None) -> tuple[float, str]:
    if override:
        return override, "--peak-gbs"
    props = torch.cuda.get_device_properties(0)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:  # double data rate: two transfers per clock
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, "memory clock x bus width"
    for words, gbs in KNOWN_PEAKS:
        if all(w.lower() in props.name.lower() for w in words):
            return float(gbs), f"data sheet ({' '.join(words)})"
    sys.exit(f"unknown peak bandwidth for {props.name}; pass --peak-gbs (the data-sheet HBM bandwidth in GB/s)")


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB: bytes read + written / median time."""
    import triton.testing

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=5, rep=50, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def bench_decode_attention(
    batch: int, context: int, ceilings: dict, heads=32, kv_heads=8, dim=128, device="cuda"
) -> dict:
    import triton.testing

    from langrt_kernels.decode_attention import (
        decode_attention_reference,
        decode_attention_triton,
        default_num_kv_splits,
    )

    device, dtype = torch.device(device), torch.bfloat16
    slots = batch * context
    k_buffer = torch.randn(slots, kv_heads, dim, dtype=dtype, device=device)
    v_buffer = torch.randn(slots, kv_heads, dim, dtype=dtype, device=device)
    req_to_token = torch.randperm(slots, device=device).to(torch.int32).view(batch, context)
    req_pool_indices = torch.arange(batch, dtype=torch.int32, device=device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, dim, dtype=dtype, device=device)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    splits = default_num_kv_splits(batch, kv_heads, context, device)
    args = (q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    decode_attention_triton(*args, num_kv_splits=splits, out=out)
    error = (out.float() - decode_attention_reference(*args).float()).abs().max().item()
    if not error < 3e-2:  # NaN fails too
        sys.exit(f"decode attention is wrong at batch {batch}, context {context}: max error {error}")
    ms = triton.testing.do_bench(
        lambda: decode_attention_triton(*args, num_kv_splits=splits, out=out), warmup=25, rep=100, return_mode="median"
    )
    kv_bytes = 2 * slots * kv_heads * dim * k_buffer.element_size() + 4 * slots
    gbs = kv_bytes / (ms * 1e-3) / 1e9
    del k_buffer, v_buffer
    return {"batch": batch, "context": context, "num_kv_splits": splits, "ms": ms, "bytes": kv_bytes, "gbs": gbs,
            "fraction_of_peak": gbs / ceilings["peak_gbs"], "fraction_of_copy": gbs / ceilings["copy_gbs"],
            "max_error_vs_reference": error}  # fmt: skip


def make_runner(model_dir: Path, backend: str, max_tokens: int, device: str = "cuda", graphs: bool = True):
    from langrt.model.model_runner import ModelRunner
    from langrt.model.source import ModelSource
    from langrt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(model_dir), load_format="dummy", device=device, dtype="bfloat16", attention_backend=backend,
        context_length=max_tokens, max_total_tokens=max_tokens, max_running_requests=2, log_level="warning",
        disable_cuda_graph=not graphs,
    ).resolve()  # fmt: skip
    source = ModelSource.resolve(args.model_path)
    return ModelRunner(args, source, source.model_config(), progress=False)


def step_bytes(runner, seq_len: int) -> int:
    """Bytes one batch-1 decode step must read: weights (one embedding row only) and the KV."""
    model, config = runner.model, runner.config
    weights = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if name != "embed_tokens.weight")
    if config.tie_word_embeddings:  # the table is the LM head too: read whole
        weights += model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    kv = (
        2
        * config.num_layers
        * seq_len
        * config.num_kv_heads
        * config.head_dim
        * runner.kv_pool.k_buffers[0].element_size()
    )
    return weights + kv


def time_decode_steps(runner, context: int, steps: int) -> tuple[list[float], int]:
    """Prefill a random prompt, then `steps` greedy decode steps; -> (seconds per step, final length)."""
    from langrt.model.forward_batch import ForwardBatch, ForwardMode

    device = runner.device
    row = runner.req_pool.alloc()
    prompt = torch.randint(0, runner.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    slots = runner.kv_pool.alloc(context)
    runner.req_pool.write(row, 0, slots)
    prefill = ForwardBatch.build(ForwardMode.EXTEND, prompt, slots, [row], [context], [context], device)
    token = int(runner.compute_logits(runner.forward(prefill)[-1:])[0].argmax())
    seq_len, times = context, []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        slot = runner.kv_pool.alloc(1)
        runner.req_pool.write(row, seq_len, slot)
        seq_len += 1
        batch = ForwardBatch.build(ForwardMode.DECODE, [token], slot, [row], [seq_len], [1], device)
        token = int(runner.compute_logits(runner.forward(batch))[0].argmax())  # syncs
        times.append(time.perf_counter() - start)
    return times, seq_len


def bench_decode_step(
    model_dir: Path, backend: str, graphs: bool, context: int, steps: int, ceilings: dict, device: str = "cuda"
) -> dict:
    import gc

    built = time.perf_counter()
    runner = make_runner(model_dir, backend, context + steps + 16, device, graphs)
    built = time.perf_counter() - built
    times, seq_len = time_decode_steps(runner, context, steps)
    warm = sorted(times[5:])  # the first steps compile kernels and warm the allocator
    step_s = warm[len(warm) // 2]
    nbytes = step_bytes(runner, seq_len)
    replays = runner.graphs.replays
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    peak_limit, copy_limit = nbytes / (ceilings["peak_gbs"] * 1e9), nbytes / (ceilings["copy_gbs"] * 1e9)
    return {"backend": backend, "cuda_graphs": graphs, "graph_replays": replays, "context": context, "steps": steps,
            "median_step_ms": step_s * 1e3, "best_step_ms": warm[0] * 1e3, "bytes_per_step": nbytes,
            "limit_ms": copy_limit * 1e3, "fraction_of_limit": copy_limit / step_s, "peak_limit_ms": peak_limit * 1e3,
            "fraction_of_peak_limit": peak_limit / step_s, "runner_start_s": built}  # fmt: skip


def bench_bitmask(rows: int, vocab: int, dtype: torch.dtype, ceilings: dict, device: str = "cuda") -> dict:
    """The Triton bitmask kernel on random masks (about half the tokens allowed), checked against
    the reference first, then timed; beside it, masked_fill_ with the mask already unpacked."""
    import triton.testing

    from langrt_kernels.grammar_bitmask import apply_token_bitmask_reference, apply_token_bitmask_triton

    words = (vocab + 31) // 32
    gen = torch.Generator(device=device).manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, device=device, generator=gen)
    logits = torch.randn(rows, vocab, dtype=dtype, device=device, generator=gen)
    expected = logits.clone()
    apply_token_bitmask_reference(expected, bitmask)
    got = logits.clone()
    apply_token_bitmask_triton(got, bitmask)
    if not torch.equal(got, expected):
        sys.exit(f"the bitmask kernel disagrees with the reference at {rows} x {vocab} {dtype}")
    banned = torch.isinf(expected)
    ms = triton.testing.do_bench(
        lambda: apply_token_bitmask_triton(got, bitmask), warmup=25, rep=100, return_mode="median"
    )
    fill_ms = triton.testing.do_bench(
        lambda: got.masked_fill_(banned, float("-inf")), warmup=25, rep=100, return_mode="median"
    )
    nbytes = bitmask.numel() * 4 + int(banned.sum()) * logits.element_size()
    gbs = nbytes / (ms * 1e-3) / 1e9
    return {"rows": rows, "vocab": vocab, "dtype": str(dtype).removeprefix("torch."), "us": ms * 1e3,
            "bytes": nbytes, "gbs": gbs, "fraction_of_copy": gbs / ceilings["copy_gbs"],
            "masked_fill_unpacked_us": fill_ms * 1e3, "banned_fraction": banned.float().mean().item()}  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer shapes and steps")
    parser.add_argument("--peak-gbs", type=float, default=None, help="peak HBM bandwidth in GB/s (default: detected)")
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens before the timed decode steps")
    parser.add_argument("--steps", type=int, default=None, help="timed decode steps per way (default 100, --quick 20)")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["attention", "step", "bitmask"], help="parts not to run"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="results JSON (default: benchmarks/results/bench_kernels[_quick].json)"
    )
    return parser.parse_args()


def run_attention(results: dict, quick: bool) -> None:
    shapes = (
        [(1, 8192), (32, 4096), (64, 8192)]
        if quick
        else [(1, 1024), (1, 8192), (1, 32768), (8, 4096), (32, 1024), (32, 4096), (64, 8192)]
    )
    for batch, context in shapes:
        r = bench_decode_attention(batch, context, results)
        results["decode_attention"].append(r)
        print(f"decode attention  batch {batch:>2} context {context:>5} splits {r['num_kv_splits']:>2}: {r['ms'] * 1e3:8.1f} us, "
              f"{r['gbs']:6.0f} GB/s = {r['fraction_of_peak']:.0%} of peak, {r['fraction_of_copy']:.0%} of copy", flush=True)  # fmt: skip


def run_steps(results: dict, context: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(LLAMA3_8B))
        for backend, graphs in (("triton", True), ("triton", False), ("torch", False)):
            r = bench_decode_step(model_dir, backend, graphs, context, steps, results)
            results["decode_step"].append(r)
            way = f"{backend}{' + CUDA graphs' if graphs else ''}"
            print(f"Llama-3-8B shape, batch 1, context {context}, {way:>21}: {r['median_step_ms']:.2f} ms/step "
                  f"(best {r['best_step_ms']:.2f}), limit {r['limit_ms']:.2f} ms at copy bandwidth = "
                  f"{r['fraction_of_limit']:.0%} ({r['fraction_of_peak_limit']:.0%} of the peak limit)", flush=True)  # fmt: skip


def run_bitmask(results: dict) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        r = bench_bitmask(64, LLAMA3_8B["vocab_size"], dtype, results)
        results["bitmask"].append(r)
        print(f"grammar bitmask 64 x {r['vocab']} {r['dtype']:>8}: {r['us']:6.1f} us ({r['gbs']:5.0f} GB/s moved), "
              f"masked_fill_ on unpacked bools {r['masked_fill_unpacked_us']:6.1f} us", flush=True)  # fmt: skip


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit(
            "bench_kernels.py measures the Triton kernels on a CUDA GPU, and torch sees none here; run it on a GPU machine"
        )
    import triton

    peak, peak_source = peak_bandwidth_gbs(args.peak_gbs)
    copy_gbs = copy_bandwidth_gbs()
    name = torch.cuda.get_device_name(0)
    print(f"{name}: peak {peak:.0f} GB/s ({peak_source}), measured copy {copy_gbs:.0f} GB/s", flush=True)
    results = {"device": name, "torch": torch.__version__, "triton": triton.__version__, "peak_gbs": peak,
               "peak_source": peak_source, "copy_gbs": copy_gbs, "decode_attention": [], "decode_step": [], "bitmask": []}  # fmt: skip
    out = args.out or RESULTS / f"bench_kernels{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = [("attention", lambda: run_attention(results, args.quick)), ("bitmask", lambda: run_bitmask(results)),
             ("step", lambda: run_steps(results, args.context, args.steps or (20 if args.quick else 100)))]  # fmt: skip
    for part, run in parts:
        if part not in args.skip:
            run()
            write_results(out, results)  # after each part: a later failure keeps the earlier figures
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
