"""Weights kept in GGUF's quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K), multiplied by langrt's C++ kernels
(kernels/cpu/quant.py) without being dequantized.

At batch 1 a decode step reads every weight once, so bytes per weight set the speed: SmolLM2's
Q4_1 layers are 0.625 bytes per weight where bfloat16 is 2 and float32 4. `--quantization auto`
keeps a GGUF file's blocks on CPU where the kernels can be built; `none` dequantizes them at load
into --dtype, as before. `int8` and `int4` quantize a checkpoint of plain weights at load into
the same blocks (Q8_0; Q4_1 with a Q8_0 LM head), so both take one set of kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# GGML type -> (name, bytes per block of 32 weights in langrt's layout: Q4_K and Q6_K kept in
# super-blocks near GGUF's size, quant_kernels.h; Q2_K, Q3_K, Q5_K unpacked with float32 scales, kquants)
BLOCK_TYPES = {
    2: ("Q4_0", 18),
    3: ("Q4_1", 20),
    6: ("Q5_0", 22),
    7: ("Q5_1", 24),
    8: ("Q8_0", 34),
    10: ("Q2_K", 24),
    11: ("Q3_K", 20),
    12: ("Q4_K", 18.5),
    13: ("Q5_K", 28),
    14: ("Q6_K", 26.25),
}
BLOCK = 32
# GGML type -> (bytes, weights) of a block in a GGUF file: what a matrix takes there.
FILE_BLOCKS = {
    2: (18, 32),
    3: (20, 32),
    6: (22, 32),
    7: (24, 32),
    8: (34, 32),
    10: (84, 256),
    11: (110, 256),
    12: (144, 256),
    13: (176, 256),
    14: (210, 256),
}
# Q4_K and Q6_K (Q4_K_M files' bulk) are repacked by the C++ kernels into super-blocks of about
# GGUF's size (a decode step reads ~the file's bytes); the other K-quants are unpacked by kquants.
REPACKED_K_QUANTS = (12, 14)
Q4_1, Q8_0 = 3, 8
# --quantization for plain weights -> the GGML types of (the layers, the LM head). Groups of 32
# with their own scale (and minimum, Q4_1): finer than per-channel int8, and the LM head stays at
# 8 bits as in llama.cpp's Q4 files, where 4-bit logits would cost the most accuracy.
PLAIN_QUANTIZATIONS = {"int8": (Q8_0, Q8_0), "int4": (Q4_1, Q8_0)}
# What the pass running now is (QuantPass, given by the ModelRunner before each pass): a decoding pass
# (running requests' tokens and drafts, no prompt rows) sends a single row to the blocks; a
# decoding pass of 2 to FLY_MAX_ROWS bf16 rows dequantizes the blocks tile by tile on AVX512-BF16
# CPUs. A prompt pass of PROMPT_TILE_MIN_ROWS rows or more multiplies the blocks' exact values,
# dequantized 16 weight rows at a time into float32 panels (kernels/cpu/quant_gemm.cpp: no float
# copy of the weights is kept or made whole), where the int16 block kernel's products per
# instruction are fewer than a float GEMM's; fewer rows take the block kernel. Only where a bf16
# copy was asked for (--cpu-dense-copy, `add_dense_copy`) do bf16 prompt passes take the copy.
PROMPT_TILE_MIN_ROWS = 128
# Measured on SmolLM2's layers (2-core Zen 4, 30 layers' weights streamed from memory, Q4_1): the
# tile dequantization beats the bf16 copy 2.1x at 2 rows, 1.5x at 4, 1.3x at 6, 1.1-1.25x at 9 (a
# token and 8 drafts), and from 10 to 17 rows the two are even (0.98-1.01x).
FLY_MAX_ROWS = 9
# Q8_0's blocks (1.06 bytes a weight, dearer to dequantize) are nearer the copy's 2 bytes: on the
# same layers the tiles win 1.55x at 2 rows and 1.09x at 4, and lose from 6 (0.86x); the LM head
# (49,152 x 576) at 9 rows takes 3.9 ms on tiles, 2.4 on the copy.
FLY_MAX_ROWS_Q8_0 = 4
# The types whose tiles quant_bf16.cpp dequantizes with vector code. The others (Q2_K, Q3_K, Q6_K
# in its GGUF-sized layout; the 5-bit types take the VNNI kernel first) would be dequantized by the
# plain C++ loop, a few cycles a weight, slower than reading the copy: their passes of several
# rows take the copy.
FLY_TYPES = (2, 3, 8, 12)
# On AVX512-VNNI CPUs the 4- and 5-bit blocks (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K: VNNI_TYPES) multiply 16 weight rows at a
# time in integers (quant_vnni.cpp), a single decode row as a decoding pass of up to VNNI_MAX_ROWS
# bf16 rows, which the tiles and the copy took before: so those passes take the blocks' exact
# values, and each row's bits whatever the other rows are (drafts verified in one pass give the
# tokens decoding one at a time gives). SmolLM2's 120 Q4_1 layer matrices read from memory, 2
# threads, 2-core Zen 4, ms (vnni / tiles / copy): 2 rows 4.1 / 5.9 / 13.2, 5 rows 6.7 / 8.3 /
# 11.8, 9 rows 9.4 / 11.6 / 13.4, 13 rows 12.4-12.8 / 14.4-15.0 / 14.9-17.1, 16 rows
# 15.0-16.9 / 15.6-17.0 / 15.2-16.6 (even there; passes of more rows take the copy).
VNNI_MAX_ROWS = 16
VNNI_TYPES = (2, 3, 6, 7, 12, 13)


@dataclass(frozen=True)
class QuantPass:
    """What the pass running now is, as `QuantizedWeight.matmul` routes its products (the limits
    above say why). `QuantPass()`, no pass given: every product on the blocks or the copy."""

    decoding: bool = False  # no prompt rows (decodes, drafts): a single row takes the blocks
    fly_max_rows: int = 0  # the most bf16 rows dequantized tile by tile (0: none)
    vnni_max_rows: int = 0  # the most bf16 rows on the 4- and 5-bit blocks' integer kernel (0: none)
    prompt_tile_min_rows: int = 0  # the fewest rows multiplied on dequantized panels (0: none)

    @classmethod
    def of(cls, decode: bool, decoding: bool = False) -> QuantPass:
        """A decode pass, a pass of running requests' tokens and drafts (`decoding`), or a prompt
        pass, on this CPU's kernels."""
        from langrt_kernels.cpu import quant

        no_prompt = decode or decoding
        return cls(
            decoding=no_prompt,
            fly_max_rows=FLY_MAX_ROWS if no_prompt and quant.bf16_rows() else 0,
            vnni_max_rows=VNNI_MAX_ROWS if no_prompt and quant.vnni_rows() else 0,
            prompt_tile_min_rows=0 if no_prompt else PROMPT_TILE_MIN_ROWS,
        )

    def fly_rows(self, ggml_type: int | None = None) -> int:
        """The most bf16 rows multiplied by dequantizing tiles of blocks of `ggml_type` (0: none)."""
        if ggml_type is not None and ggml_type not in FLY_TYPES:
            return 0
        return min(self.fly_max_rows, FLY_MAX_ROWS_Q8_0) if ggml_type == Q8_0 else self.fly_max_rows

    def vnni_rows(self, ggml_type: int | None = None) -> int:
        """The most bf16 rows sent to the blocks' integer kernel for `ggml_type` (None: for the 4-
        and 5-bit types; 0: none)."""
        return self.vnni_max_rows if ggml_type is None or ggml_type in VNNI_TYPES else 0


@dataclass
class PassContext:
    """The pass a model runs now, as its quantized weights see it. One per ModelRunner (a draft
    model's runner has its own), handed to its model's weights at load (`attach_pass_context`);
    the runner gives it a new QuantPass before each pass. A weight never attached keeps its own,
    at QuantPass()."""

    quant: QuantPass = field(default_factory=QuantPass)


@dataclass(eq=False)  # compared by identity (the tensors are not comparable as values)
class QuantizedWeight:
    """A [out_features, in_features] weight as rows of blocks: `data` is uint8 [out, in / 32 *
    block bytes] in the kernels' row layout (`from_gguf` makes it), `ggml_type` the blocks' GGML
    type number."""

    data: torch.Tensor
    ggml_type: int
    in_features: int
    # oneDNN-packed bfloat16 values (see `add_dense_copy`) for passes of several rows, or None.
    dense: torch.Tensor | None = None
    # the running pass (its ModelRunner's, see attach_pass_context), read by `matmul`
    context: PassContext = field(default_factory=PassContext, repr=False)

    @classmethod
    def from_gguf(cls, rows: torch.Tensor, ggml_type: int, in_features: int) -> "QuantizedWeight":
        """From a GGUF tensor's bytes, uint8 [out, row bytes]."""
        from langrt_kernels.cpu.quant import repack
        from langrt.model import kquants

        if ggml_type in kquants.SUPER_BYTES and ggml_type not in REPACKED_K_QUANTS:
            return cls(torch.from_numpy(kquants.unpack(rows.numpy(), ggml_type, in_features)), ggml_type, in_features)
        return cls(repack(rows, ggml_type), ggml_type, in_features)

    @classmethod
    def quantize(cls, weight: torch.Tensor, ggml_type: int) -> "QuantizedWeight":
        """From plain values [out, in] (in a multiple of 32), rounded into blocks by gguf-py's
        quantizer (llama.cpp's rounding), 4,096 rows at a time."""
        import gguf
        import numpy as np

        qtype = gguf.GGMLQuantizationType(ggml_type)
        parts = [gguf.quants.quantize(part.float().numpy(), qtype) for part in weight.detach().split(4096)]
        rows = torch.from_numpy(np.concatenate(parts).reshape(weight.shape[0], -1))
        return cls.from_gguf(rows, ggml_type, weight.shape[1])

    @property
    def out_features(self) -> int:
        return self.data.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def type_name(self) -> str:
        return BLOCK_TYPES[self.ggml_type][0]

    def add_dense_copy(self) -> None:
        """Keep the values too, packed for oneDNN's bfloat16 GEMM: where the CPU has AVX512-BF16,
        that GEMM beats the blocks from 2 rows up (3-4x at 16-64 rows, SmolLM2's layers), while a
        single row, bound by reading the weights, is 2-15x faster on the blocks. `matmul` sends
        a decoding pass's single row (a decode, or the one row of a pass with drafts whose whole
        logits are wanted) to the blocks and every other pass to the copy (see set_pass):
        the copy's values are rounded to bfloat16, the blocks' are exact, and a greedy near-tie
        must not go one way for a prompt computed whole and the other when it is cached."""
        from langrt.model.layers import pack_weight

        self.dense = pack_weight(self.dequantize(torch.bfloat16))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> x W^T [T, out] in x's dtype (float32 or bfloat16)."""
        step = self.context.quant
        single_decode_row = step.decoding and x.shape[0] == 1
        if x.dtype == torch.bfloat16 and 2 <= x.shape[0] <= self._vnni_rows(step):
            return self._blocks_matmul(x.contiguous() if x.stride(-1) != 1 else x)
        if x.dtype == torch.bfloat16 and 2 <= x.shape[0] <= self._fly_rows(step):
            return self._fly_matmul(x.contiguous() if x.stride(-1) != 1 else x)
        if 0 < step.prompt_tile_min_rows <= x.shape[0] and (x.dtype == torch.float32 or self.dense is None):
            return self._tile_matmul(x.contiguous() if x.stride(-1) != 1 else x)
        if self.dense is not None and not single_decode_row and x.dtype == torch.bfloat16:
            return torch.ops.mkldnn._linear_pointwise(x, self.dense, None, "none", [], "")
        return self._blocks_matmul(x.contiguous() if x.stride(-1) != 1 else x)

    def _fly_rows(self, step: QuantPass) -> int:
        return step.fly_rows(self.ggml_type)

    def _vnni_rows(self, step: QuantPass) -> int:
        return step.vnni_rows(self.ggml_type)

    def _blocks_matmul(self, x: torch.Tensor) -> torch.Tensor:
        from langrt_kernels.cpu.quant import quant_linear

        return quant_linear(x, self.data, self.ggml_type)

    def _fly_matmul(self, x: torch.Tensor) -> torch.Tensor:
        from langrt_kernels.cpu.quant import dense_linear

        return dense_linear(x, self.data, self.ggml_type)

    def _tile_matmul(self, x: torch.Tensor) -> torch.Tensor:
        from langrt_kernels.cpu.quant import tile_linear

        return tile_linear(x, self.data, self.ggml_type)

    def rows(self, ids: torch.Tensor) -> QuantizedWeight:
        """The weight's rows `ids` (1-D, in that order) as a weight of their own: each row's
        blocks are its own, so they are selected as they are."""
        return QuantizedWeight(self.data.index_select(0, ids), self.ggml_type, self.in_features, context=self.context)

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight's values, [out, in] in `dtype` (exact in float32)."""
        from langrt_kernels.cpu.quant import dequantize

        direct = dtype if dtype in (torch.float32, torch.bfloat16) else torch.float32  # the kernel's outputs
        return dequantize(self.data, self.ggml_type, self.in_features, direct).to(dtype)

    def logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """[K]: (hidden[rows[k]] W^T)[token_ids[k]], each what `matmul` gives at that place (the
        rows are quantized as matmul quantizes them), computing only those products."""
        out = torch.empty(rows.shape[0], dtype=hidden.dtype)
        for row in rows.unique().tolist():
            places = (rows == row).nonzero().flatten()
            part = self.rows(token_ids.index_select(0, places)).matmul(hidden[row : row + 1])
            out[places] = part[0]
        return out


@dataclass(eq=False)
class StackedQuantizedWeight(QuantizedWeight):
    """A fused matrix whose row ranges are blocks of different types (Q4_K_M files keep some
    layers' v projection in Q6_K beside Q4_K q and k): each part multiplies its own rows and the
    outputs sit side by side. `data` is empty; `ggml_type` is the first part's."""

    parts: list[QuantizedWeight] = field(default_factory=list)

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def type_name(self) -> str:
        return "+".join(dict.fromkeys(p.type_name for p in self.parts))

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def _fly_rows(self, step: QuantPass) -> int:
        return min(p._fly_rows(step) for p in self.parts)

    def _vnni_rows(self, step: QuantPass) -> int:
        return min(p._vnni_rows(step) for p in self.parts)

    def _blocks_matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p._blocks_matmul(x) for p in self.parts], dim=-1)

    def _fly_matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p._fly_matmul(x) for p in self.parts], dim=-1)

    def _tile_matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p._tile_matmul(x) for p in self.parts], dim=-1)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.cat([p.dequantize(dtype) for p in self.parts])

    def logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.matmul(hidden[r : r + 1])[0, t] for r, t in zip(rows.tolist(), token_ids.tolist())])


def stack_parts(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Row ranges of one matrix, in order, as one weight: their rows joined where they share a type."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if all(p.ggml_type == first.ggml_type for p in parts):
        return QuantizedWeight(torch.cat([p.data for p in parts]), first.ggml_type, first.in_features)
    return StackedQuantizedWeight(
        torch.empty(0, dtype=torch.uint8), first.ggml_type, first.in_features, parts=list(parts)
    )


def attach_pass_context(model: torch.nn.Module, context: PassContext) -> int:
    """Hand `context` to every QuantizedWeight `model` holds (the layers' `packed`, the LM head's,
    the experts' lists) and to the model (`pass_context`: the fused path reads it); -> how many
    weights. After load, once the weights are final."""
    count = 0
    for module in model.modules():
        for value in list(vars(module).values()):
            for weight in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(weight, QuantizedWeight):
                    weight.context = context
                    count += 1
    model.pass_context = context
    return count
