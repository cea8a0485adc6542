"""Which of a GGUF file's quantized tensors keep their blocks at load, and a log line naming every
one that is expanded to floats and why: a file's matrices are never dequantized silently.

A matrix keeps its blocks where langrt's kernels take its type (langrt.model.quant.BLOCK_TYPES)
and every matrix fused with it (q/k/v, gate/up) has blocks too; mixed block types are fine (they
multiply as row ranges of one matrix), but a fused matrix part blocks, part floats is not. A
3-D stacked experts tensor (a mixture-of-experts file's ffn_*_exps) counts as one matrix here:
each of its experts is kept as a block matrix of its own.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Iterable, Protocol, Sequence

import gguf

logger = logging.getLogger("langrt.model.gguf_loader")
# Mixture-of-experts tensors: the experts stacked [experts, rows, cols] (one block matrix per
# expert, kept as blocks), and a layer's router (not a Linear in langrt: its floats pick the experts).
_EXPERTS = "_exps."
_ROUTER = ".ffn_gate_inp."


class TensorInfo(Protocol):
    name: str
    shape: tuple[int, ...]
    ggml_type: int


def kept_as_blocks(tensors: Iterable[TensorInfo], fused_groups: Iterable[Sequence[str]], source: str) -> set[str]:
    """Names of the tensors served as stored blocks; logs once which quantized ones are not."""
    from langrt.model.quant import BLOCK_TYPES

    infos = {t.name: t for t in tensors}
    quantized = {name: t for name, t in infos.items() if _is_quantized(t.ggml_type)}
    expanded: dict[str, str] = {}
    for name, t in quantized.items():
        if len(t.shape) != (3 if _EXPERTS in name else 2):
            expanded[name] = f"a {len(t.shape)}-D {_type_name(t.ggml_type)} tensor: the block kernels take matrices"
        elif _ROUTER in name:
            expanded[name] = "an expert router: langrt scores the experts with plain weights"
        elif t.ggml_type not in BLOCK_TYPES:
            expanded[name] = f"stored as {_type_name(t.ggml_type)}, which langrt's block kernels do not take"
    kept = set(quantized) - set(expanded)
    for group in fused_groups:
        present = [n for n in group if n in infos]
        floats = [n for n in present if n not in kept]
        for name in (n for n in present if n in kept and floats):
            other = floats[0]
            expanded[name] = f"fused with {other}, {_type_name(infos[other].ggml_type)}, which is not kept as blocks"
            kept.discard(name)
    _log(source, {n: quantized[n].ggml_type for n in kept}, expanded)
    return kept


def _log(source: str, kept: dict[str, int], expanded: dict[str, str]) -> None:
    counts = Counter(_type_name(t) for t in kept.values())
    types = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
    if not expanded:
        logger.info(
            "%s: all %d quantized matrices kept in their stored blocks (%s)", source, len(kept), types or "none"
        )
        return
    names = "; ".join(f"{name} ({why})" for name, why in expanded.items())
    logger.warning(
        "%s: %d quantized tensors expanded to floats at load: %s. Kept in their stored blocks: %d (%s)",
        source,
        len(expanded),
        names,
        len(kept),
        types or "none",
    )


def _is_quantized(ggml_type: int) -> bool:
    """Stored in blocks of several values (not F32 / F16 / BF16 / integers)."""
    try:
        return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)][0] > 1
    except (ValueError, KeyError):
        return True  # a type gguf-py does not know: certainly not plain floats


def _type_name(ggml_type: int) -> str:
    try:
        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"GGML type {ggml_type}"
