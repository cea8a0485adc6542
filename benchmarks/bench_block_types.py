"""Single-row (decode) products on each GGUF block type langrt's CPU kernels take, side by side.

Sixteen 2048 x 2048 matrices of one type (64M weights: more than the caches hold, so each pass
reads them from memory, as a decode step reads a model's layers) times one activation row, by
kernels/cpu/quant.py's quant_linear; reports the median pass, the weights' bytes read per second
in langrt's layout, and weights per second; the types' passes take turns, so a busy machine
slows each alike. The same values in every type's run are not needed:
the time depends only on the type.

    .venv/bin/python benchmarks/bench_block_types.py [--isa avx2|scalar] [--threads N] [--quick]

Results: results/bench_block_types[_quick][_<isa>][_<N>t].json, with the CPU's flags.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from bench_offline import cpu_flags_summary  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
SIDE = 2048


def matrices(qtype: str, count: int) -> list:
    """`count` distinct copies of one random matrix in `qtype`'s blocks (QuantizedWeight)."""
    import gguf

    from gguf_utils import Q, random_k_quant_rows
    from langrt.model.quant import QuantizedWeight

    t = Q[qtype]
    if qtype.endswith("_K"):
        raw = torch.from_numpy(random_k_quant_rows(t, SIDE, SIDE, seed=0))
        first = QuantizedWeight.from_gguf(raw, int(t), SIDE)
    else:
        values = np.random.default_rng(0).standard_normal((SIDE, SIDE)).astype(np.float32)
        first = QuantizedWeight.from_gguf(
            torch.from_numpy(gguf.quants.quantize(values, t).reshape(SIDE, -1)), int(t), SIDE
        )
    return [first] + [QuantizedWeight(first.data.clone(), first.ggml_type, SIDE) for _ in range(count - 1)]


def measure(types: list[str], count: int, passes: int) -> list[dict]:
    """Each type's pass, float32 and bfloat16 activations, and the same matrices expanded to
    float32 / bfloat16 values (what a matrix the kernels do not take costs: a plain weight's
    single row is at::mv), the runs interleaved pass by pass (a busy machine then slows every
    one alike): the median and the fastest pass of each."""
    from langrt_kernels.cpu import quant

    weights = {qtype: matrices(qtype, count) for qtype in types}
    x = {dtype: torch.randn(1, SIDE).to(dtype) for dtype in (torch.float32, torch.bfloat16)}
    tasks = {}  # (name, activations) -> (one pass, bytes read)
    for qtype, ws in weights.items():
        for dtype in x:
            run = lambda ws=ws, x=x[dtype]: [quant.quant_linear(x, w.data, w.ggml_type) for w in ws]  # noqa: E731
            tasks[(qtype, dtype)] = (run, sum(w.nbytes for w in ws))
    for dtype in x:
        dense = [w.dequantize(dtype) for w in weights[types[0]]]
        run = lambda dense=dense, x=x[dtype][0]: [torch.mv(w, x) for w in dense]  # noqa: E731
        tasks[(f"{str(dtype).removeprefix('torch.')} values", dtype)] = (run, sum(w.nbytes for w in dense))
    times = {key: [] for key in tasks}
    for _ in range(passes):
        for key, (run, _) in tasks.items():
            started = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - started)
    n_weights = count * SIDE * SIDE
    rows = []
    for (name, dtype), took in times.items():
        seconds, fastest = statistics.median(took[2:]), min(took[2:])  # the first passes warm the allocator
        nbytes = tasks[(name, dtype)][1]
        rows.append({
            "type": name,
            "activations": str(dtype).removeprefix("torch."),
            "bytes_per_weight": nbytes / n_weights,
            "ms_per_pass": 1e3 * seconds,
            "ms_fastest": 1e3 * fastest,
            "gb_per_s": nbytes / seconds / 1e9,
            "gweights_per_s": n_weights / seconds / 1e9,
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--isa", choices=["avx2", "scalar"], default=None, help="force the kernels' ISA (default: the CPU's best)"
    )
    parser.add_argument("--quick", action="store_true", help="4 matrices, 5 passes")
    parser.add_argument("--types", nargs="*", default=TYPES)
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.isa:
        os.environ["LANGRT_CPU_ISA"] = args.isa
    from langrt_kernels.cpu import quant

    if not quant.available():
        sys.exit(f"the quantized CPU kernels are off here: {quant.unavailable_reason()}")
    count, passes = (4, 5) if args.quick else (16, 25)
    rows = measure(args.types, count, passes)
    for row in rows:
        print(
            f"{row['type']:15s} {row['activations']:8s} {row['bytes_per_weight']:.3f} B/weight  {row['ms_per_pass']:7.2f} ms "
            f"(fastest {row['ms_fastest']:7.2f})  {row['gb_per_s']:6.1f} GB/s  {row['gweights_per_s']:5.1f} Gweights/s"
        )
    result = {
        "isa": quant.describe_isa(),
        "cpu_flags": cpu_flags_summary(),
        "threads": torch.get_num_threads(),
        "matrices": f"{count} x [{SIDE}, {SIDE}]",
        "rows": rows,
    }
    suffix = f"{'_quick' if args.quick else ''}{'_' + args.isa if args.isa else ''}{f'_{args.threads}t' if args.threads else ''}"
    name = f"bench_block_types{suffix}.json"
    write_results(RESULTS / name, result)
    print(f"-> {RESULTS / name}")


if __name__ == "__main__":
    main()
