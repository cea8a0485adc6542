"""How a model's weights are served, decided at load, and the log lines that say so: GGUF blocks
as stored or dequantized (`serve_gguf_blocks`), plain weights quantized at load
(`plain_quantization`), the bfloat16 copies' memory budget, and what was chosen
(`describe_blocks`). The blocks themselves: quant.py."""

from __future__ import annotations

from langrt.model.quant import (
    BLOCK_TYPES,
    FILE_BLOCKS,
    FLY_MAX_ROWS,
    PLAIN_QUANTIZATIONS,
    PROMPT_TILE_MIN_ROWS,
    REPACKED_K_QUANTS,
    VNNI_MAX_ROWS,
    VNNI_TYPES,
    QuantizedWeight,
    StackedQuantizedWeight,
)


def dense_copy_budget() -> int:
    """Bytes quantized layers may add as bfloat16 copies (add_dense_copy): a quarter of the RAM
    available now, so a model too big for its copies keeps only its blocks."""
    try:
        with open("/proc/meminfo") as meminfo:
            info = dict(line.split(":", 1) for line in meminfo)
        return int(info["MemAvailable"].split()[0]) * 1024 // 4
    except (OSError, KeyError, ValueError):
        return 0


def describe_blocks(model) -> str:
    """One line for the log: how many matrices are served as blocks, and whether copies were added."""
    weights = [m.packed for m in model.modules() if isinstance(getattr(m, "packed", None), QuantizedWeight)]
    head = getattr(model, "lm_head_packed", None)
    weights += [head] if isinstance(head, QuantizedWeight) and head not in weights else []
    copies = sum(w.dense is not None for w in weights)
    types = sorted({w.type_name for w in weights})
    line = f"{len(weights)} matrices served as {'/'.join(types)} blocks ({_sizes(weights)})"
    if copies:
        copy_mb = 2 * sum(w.out_features * w.in_features for w in weights) / 1e6
        line += f"; bfloat16 copies ({copy_mb:.0f} MB, --cpu-dense-copy) for prompts and passes of many rows"
    else:
        line += f"; prompts of {PROMPT_TILE_MIN_ROWS}+ rows multiply them on dequantized float32 panels (no copy kept)"
    from langrt_kernels.cpu import quant

    vnni = (
        copies and quant.vnni_rows() and any(w.ggml_type in VNNI_TYPES for w in weights)
    )  # copies: bfloat16 activations
    if vnni:
        line += f"; decoding passes of 2-{VNNI_MAX_ROWS} bfloat16 rows multiply 4- and 5-bit blocks 16 rows at a time (AVX512-VNNI)"
    if copies and quant.bf16_rows():
        other = " other" if vnni else ""
        line += f";{other} decoding passes of 2-{FLY_MAX_ROWS} bfloat16 rows dequantize the blocks tile by tile (AVX512-BF16)"
    return line


def _sizes(weights: list[QuantizedWeight]) -> str:
    """Their bytes as kept, against the file's: Q4_K / Q6_K repacked in super-blocks near the
    file's size, Q2_K / Q3_K / Q5_K unpacked into blocks of 32 with float32 scales."""
    parts = [p for w in weights for p in (w.parts if isinstance(w, StackedQuantizedWeight) else [w])]
    kept = sum(p.nbytes for p in parts)
    in_file = sum(
        p.out_features * p.in_features * FILE_BLOCKS[p.ggml_type][0] // FILE_BLOCKS[p.ggml_type][1] for p in parts
    )
    repacked = sorted({p.type_name for p in parts if p.ggml_type in REPACKED_K_QUANTS})
    unpacked = sorted(
        {p.type_name for p in parts if p.ggml_type in FILE_BLOCKS and FILE_BLOCKS[p.ggml_type][1] == 256}
        - set(repacked)
    )
    how = [f"{'/'.join(repacked)} repacked in super-blocks"] * bool(repacked) + [
        f"{'/'.join(unpacked)} unpacked"
    ] * bool(unpacked)
    return f"{kept / 1e6:.0f} MB, {kept / max(in_file, 1):.2f}x the file's {in_file / 1e6:.0f} MB" + "".join(
        f"; {h}" for h in how
    )


def plain_quantization(args, source) -> tuple[str | None, str]:
    """(--quantization int8 or int4 when it applies, else None; a line for the log). Raises
    ModelLoadError where it was asked for and cannot be served."""
    from langrt.errors import ModelLoadError

    if args.quantization not in PLAIN_QUANTIZATIONS:
        return None, ""
    if source.is_gguf and args.load_format != "dummy":
        raise ModelLoadError(
            f"--quantization {args.quantization} quantizes plain weights; {source.path} is GGUF, already quantized: "
            "--quantization auto serves its blocks as stored"
        )
    from langrt_kernels.cpu import quant

    if not quant.available():
        raise ModelLoadError(
            f"--quantization {args.quantization} needs langrt's quantized CPU kernels, which are off here "
            f"({quant.unavailable_reason() or 'they could not be built: see the warning above'})"
        )
    layers, head = (BLOCK_TYPES[t][0] for t in PLAIN_QUANTIZATIONS[args.quantization])
    return (
        args.quantization,
        f"quantized at load (--quantization {args.quantization}): layers to {layers}, the LM head to {head} blocks, {quant.describe_isa()} kernels",
    )


def serve_gguf_blocks(args, source) -> tuple[bool, str]:
    """(whether a GGUF file's quantized matrices keep their blocks, why: a line for the log)."""
    dequantized = f"GGUF blocks dequantized to {args.dtype} at load"
    if args.quantization == "none":
        return False, f"{dequantized} (--quantization none)"
    if not source.is_gguf or args.load_format == "dummy":
        return False, f"weights in {args.dtype}"
    if args.device != "cpu":
        return False, f"{dequantized} (the quantized kernels are CPU kernels)"
    if args.dtype not in ("float32", "bfloat16"):
        return False, f"{dequantized} (the quantized kernels take float32 or bfloat16 activations)"
    if args.enable_torch_compile:
        return False, f"{dequantized} (--enable-torch-compile compiles plain weights)"
    from langrt_kernels.cpu import quant

    if not quant.available():
        return (
            False,
            f"{dequantized} (quantized kernels off: {quant.unavailable_reason() or 'they could not be built'})",
        )
    types = "/".join(name for name, _ in BLOCK_TYPES.values())
    return True, f"{types} blocks served as stored, {quant.describe_isa()} kernels, activations in {args.dtype}"
