"""Weights kept in GGUF's quantized blocks (Q4_0, Q4_1, Q8_0), multiplied by langrt's C++ kernels
(kernels/cpu/quant.py) without being dequantized.

At batch 1 a decode step reads every weight once, so bytes per weight set the speed: SmolLM2's
Q4_1 layers are 0.625 bytes per weight where bfloat16 is 2 and float32 4. `--quantization auto`
keeps a GGUF file's blocks on CPU where the kernels can be built; `none` dequantizes them at load
into --dtype, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# GGML type -> (name, bytes per block of 32 weights)
BLOCK_TYPES = {2: ("Q4_0", 18), 3: ("Q4_1", 20), 8: ("Q8_0", 34)}
BLOCK = 32


@dataclass
class QuantizedWeight:
    """A [out_features, in_features] weight as rows of blocks: `data` is uint8 [out, in / 32 *
    block bytes] in the kernels' row layout (`from_gguf` makes it), `ggml_type` the blocks' GGML
    type number."""

    data: torch.Tensor
    ggml_type: int
    in_features: int

    @classmethod
    def from_gguf(cls, rows: torch.Tensor, ggml_type: int, in_features: int) -> "QuantizedWeight":
        """From a GGUF tensor's bytes, uint8 [out, row bytes]."""
        from kernels.cpu.quant import repack

        return cls(repack(rows, ggml_type), ggml_type, in_features)

    @property
    def out_features(self) -> int:
        return self.data.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def type_name(self) -> str:
        return BLOCK_TYPES[self.ggml_type][0]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> x W^T [T, out] in x's dtype (float32 or bfloat16)."""
        from kernels.cpu.quant import quant_linear

        if x.stride(-1) != 1:
            x = x.contiguous()
        return quant_linear(x, self.data, self.ggml_type)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight's values, [out, in] in `dtype` (exact in float32)."""
        from kernels.cpu.quant import dequantize

        values = dequantize(self.data, self.ggml_type, self.in_features, torch.float32)
        return values.to(dtype)

    def logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """[K]: (hidden[rows[k]] W^T)[token_ids[k]], each what `matmul` gives at that place (the
        rows are quantized as matmul quantizes them), computing only those products."""
        out = torch.empty(rows.shape[0], dtype=hidden.dtype)
        for row in rows.unique().tolist():
            places = (rows == row).nonzero().flatten()
            weight = self.data.index_select(0, token_ids.index_select(0, places))
            part = QuantizedWeight(weight, self.ggml_type, self.in_features).matmul(hidden[row : row + 1])
            out[places] = part[0]
        return out

    def narrow_rows(self, start: int, length: int) -> "QuantizedWeight":
        return QuantizedWeight(self.data.narrow(0, start, length), self.ggml_type, self.in_features)


def row_bytes(ggml_type: int, in_features: int) -> int:
    return in_features // BLOCK * BLOCK_TYPES[ggml_type][1]


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
    from kernels.cpu import quant

    if not quant.available():
        return False, f"{dequantized} (quantized kernels off: {quant.unavailable_reason() or 'they could not be built'})"
    return True, f"Q4_0/Q4_1/Q8_0 blocks served as stored, {quant.isa()} kernels, activations in {args.dtype}"
