"""Products on a GGUF file's blocks, side by side in one run, one layer's matrices at a time:

- `blocks`: the block kernel (int16 activations; what a decode row takes);
- `panels`: the prompt GEMM on dequantized panels (quant_gemm.cpp; no float copy of W);
- `copy`: torch's GEMM on a float32 copy of W's values made ahead (the memory a copy costs:
  4 bytes a weight; --cpu-dense-copy's bfloat16 copy is 2, where oneDNN packs bfloat16);
- `reference`: dequantize W whole, then torch's GEMM (what float32 prompts did before the panels).

For each row count: ms per pass over the layer's matrices (median of `--repeats`, the variants
alternated within each repeat), and each variant's largest relative error against `reference`.
Also the layer's bytes: the blocks as langrt keeps them, the file's, and a float32 copy's.

    .venv/bin/python benchmarks/bench_quant_gemm.py --model ~/.cache/langrt-models/qwen2.5-coder-1.5b.gguf

Results: results/bench_quant_gemm_<model>.json, with the commit, CPU flags, versions and command.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def layer_weights(path: Path, layer: int):
    """[(name, QuantizedWeight, file bytes)] of one layer's quantized matrices."""
    import gguf
    import numpy as np

    from langrt.model.quant import BLOCK_TYPES, QuantizedWeight

    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    out = []
    for short in MATRICES:
        t = tensors.get(f"blk.{layer}.{short}.weight")
        if t is None or int(t.tensor_type) not in BLOCK_TYPES:
            continue
        k, n = int(t.shape[0]), int(t.shape[1])
        raw = torch.from_numpy(np.array(t.data).reshape(n, -1).copy())
        out.append((short, QuantizedWeight.from_gguf(raw, int(t.tensor_type), k), raw.numel()))
    return out


def variants(weights):
    """name -> f(inputs by width) -> each matrix's product on the input of its width."""
    from langrt_kernels.cpu import quant

    copies = [w.dequantize(torch.float32) for _, w, _ in weights]
    ws = [w for _, w, _ in weights]
    return {
        "blocks": lambda xs: [quant.quant_linear(xs[w.in_features], w.data, w.ggml_type) for w in ws],
        "panels": lambda xs: [quant.tile_linear(xs[w.in_features], w.data, w.ggml_type) for w in ws],
        "copy": lambda xs: [torch.nn.functional.linear(xs[w.in_features], c) for w, c in zip(ws, copies)],
        "reference": lambda xs: [
            torch.nn.functional.linear(xs[w.in_features], w.dequantize(torch.float32)) for w in ws
        ],
    }


def rel_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(((g.double() - w.double()).norm() / w.double().norm()).item() for g, w in zip(got, want))


def measure(run, rows: int, widths: set[int], repeats: int) -> dict:
    xs = {k: torch.randn(rows, k) for k in widths}
    outs = {name: fn(xs) for name, fn in run.items()}  # warm-up
    times = {name: [] for name in run}
    for _ in range(repeats):  # the variants alternated, so drift in the machine's load hits each
        for name, fn in run.items():
            start = time.perf_counter()
            fn(xs)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {
        name: {"ms": statistics.median(t), "rel_error": rel_error(outs[name], outs["reference"])}
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a GGUF file")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--rows", default="1,16,128,512", help="activation rows per pass, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    path = Path(args.model).expanduser()
    weights = layer_weights(path, args.layer)
    widths = {w.in_features for _, w, _ in weights}
    run = variants(weights)
    rows = {}
    for count in (int(r) for r in args.rows.split(",")):
        rows[count] = measure(run, count, widths, args.repeats)
        print(
            count, {name: f"{v['ms']:.1f} ms, err {v['rel_error']:.1e}" for name, v in rows[count].items()}, flush=True
        )
    results = {
        "command": " ".join(sys.argv),
        "model": path.name,
        "layer": args.layer,
        "threads": torch.get_num_threads(),
        "matrices": {
            n: {"type": w.type_name, "shape": list(w.shape), "bytes": w.nbytes, "file_bytes": f} for n, w, f in weights
        },
        "bytes": {
            "blocks": sum(w.nbytes for _, w, _ in weights),
            "file": sum(f for _, _, f in weights),
            "float32_copy": sum(4 * w.out_features * w.in_features for _, w, _ in weights),
        },
        "rows": rows,
    }
    out = Path(args.out) if args.out else RESULTS / f"bench_quant_gemm_{path.stem}.json"
    print(write_results(out, results, "float32"))


if __name__ == "__main__":
    main()
