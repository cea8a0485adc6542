"""GGUF's K-quants that langrt unpacks at load: Q2_K, Q3_K and Q5_K (super-blocks of 256 weights;
Q3_K_M and Q2_K files hold them, Q4_K_M files a few Q5_K) become langrt's rows of 32-weight blocks
with float32 scales, which kernels/cpu/quant_kernels.h multiplies like Q4_1, Q5_1 and Q8_0 blocks.
Q4_K and Q6_K, the bulk of Q4_K_M files, are not unpacked: the kernels repack them into
super-blocks near the file's size (quant_kernels.h, `repack`).

Q5_K: per super-block fp16 d and dmin, eight 6-bit scales and minimums packed in 12 bytes, 32
bytes of high bits and 128 bytes of nibbles; sub-block s (32 weights) is d * scale[s] * q - dmin *
min[s]. Q3_K: 32 bytes of high bits, 64 of 2-bit lows, sixteen 6-bit scales, fp16 d; w = d *
(scale - 32) * q, q in [-4, 3]. Q2_K: sixteen 4-bit scale and minimum pairs, 64 bytes of 2-bit
quants, fp16 d and dmin; w = d * scale * q - dmin * min per 16 weights. The unpacked scales (d *
scale, -dmin * min) are exact in float32, so the values are exactly GGUF's
(tests/numerics/test_quant_linear.py checks them against gguf-py's).

Why unpack these: the kernels then decode one 32-weight block shape with its scales already
multiplied out, at the cost of bytes: per weight, GGUF -> here, Q5_K 0.69 -> 0.88, Q3_K 0.43 ->
0.63, Q2_K 0.33 -> 0.75.
"""

from __future__ import annotations

import numpy as np

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
SUPER_BLOCK = 256
SUPER_BYTES = {Q2_K: 84, Q3_K: 110, Q4_K: 144, Q5_K: 176, Q6_K: 210}


def unpack(raw: np.ndarray, ggml_type: int, k: int) -> np.ndarray:
    """GGUF rows, uint8 [N, K / 256 * super-block bytes] -> langrt's rows, uint8 [N, K / 32 *
    block bytes (quant_kernels.h's block_bytes)]: each row's quants, then its float32 scales
    (and its offsets, for the types with minimums)."""
    n, supers = raw.shape[0], k // SUPER_BLOCK
    if k % SUPER_BLOCK or raw.shape[1] != supers * SUPER_BYTES[ggml_type]:
        raise ValueError(f"{raw.shape[1]} bytes per row are not {k // SUPER_BLOCK} super-blocks of type {ggml_type}")
    blocks = raw.reshape(n, supers, SUPER_BYTES[ggml_type])
    unpackers = {Q2_K: _unpack_q2_k, Q3_K: _unpack_q3_k, Q5_K: _unpack_q5_k}
    if ggml_type not in unpackers:
        raise ValueError(f"type {ggml_type} is repacked by the kernels, not unpacked here")
    parts = unpackers[ggml_type](blocks)
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(n, -1) for p in parts], axis=1)


def _fp16(column: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32)


def _scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's 12 bytes -> 8 scales and 8 minimums of 6 bits: bytes 0-3 hold scales 0-3 (low 6 bits)
    and the top 2 bits of scales 4-7, bytes 4-7 the same for the minimums, bytes 8-11 the low 4
    bits of scales 4-7 (low nibble) and of minimums 4-7 (high nibble)."""
    first, second, low = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scale = np.concatenate([first & 0x3F, (low & 0x0F) | ((first >> 2) & 0x30)], axis=-1)
    minimum = np.concatenate([second & 0x3F, (low >> 4) | ((second >> 2) & 0x30)], axis=-1)
    return scale.astype(np.float32), minimum.astype(np.float32)


def _unpack_q5_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """-> (quants [N, supers * 8, 20]: 4 bytes of fifth bits, then Q4_1-ordered nibbles; scales
    d * scale; offsets -dmin * min), as Q4_K with the fifth bit: bit s of high byte l belongs to
    weight l of sub-block s."""
    n, supers = blocks.shape[:2]
    d, dmin = _fp16(blocks[..., 0:2]), _fp16(blocks[..., 2:4])
    scale, minimum = _scales_and_mins(blocks[..., 4:16])
    high = blocks[..., 16:48].reshape(n, supers, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    packed = blocks[..., 48:].reshape(n, supers, 4, 32)
    low = np.stack([packed & 0x0F, packed >> 4], axis=3).reshape(n, supers * 8, 32)
    q = low | ((high & 1).reshape(n, supers * 8, 32) << 4)
    return _five_bit(q), (d * scale).reshape(n, -1), (-(dmin * minimum)).reshape(n, -1)


def _unpack_q3_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """-> (quants [N, supers * 8, 12]: 4 bytes of high bits, then 8 of 2-bit lows, for q + 4 in
    [0, 7]; scales d * (scale - 32) [N, supers * 16]). gguf-py's order: weight 128c + 32j + l has
    its low bits at bits 2j of byte 32c + l and its high bit at bit 4c + j of mask byte l; its
    high bit set means q = low, clear q = low - 4."""
    n, supers = blocks.shape[:2]
    mask, lows, packed, d = blocks[..., :32], blocks[..., 32:96], blocks[..., 96:108], _fp16(blocks[..., 108:110])
    low = (lows.reshape(n, supers, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)) & 3
    high = (mask.reshape(n, supers, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    q = low.reshape(n, supers * 8, 32) | (high.reshape(n, supers * 8, 32) << 2)  # q + 4
    first, second = packed[..., :8], packed[..., 8:]
    low_scales = np.concatenate([first & 0x0F, first >> 4], axis=-1)
    high_scales = np.concatenate([(second >> shift) & 3 for shift in (0, 2, 4, 6)], axis=-1)
    scales = (low_scales | (high_scales << 4)).astype(np.float32) - 32
    return np.concatenate([_bits(q >> 2), _crumbs(q & 3)], axis=-1), (d * scales).reshape(n, -1)


def _unpack_q2_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """-> (2-bit quants [N, supers * 8, 8]; scales d * scale and offsets -dmin * min, [N, supers
    * 16] each: one per 16 weights). Weight 128c + 32j + l sits at bits 2j of byte 32c + l."""
    n, supers = blocks.shape[:2]
    packed, lows, d, dmin = blocks[..., :16], blocks[..., 16:80], _fp16(blocks[..., 80:82]), _fp16(blocks[..., 82:84])
    q = (lows.reshape(n, supers, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)) & 3
    scale, minimum = (packed & 0x0F).astype(np.float32), (packed >> 4).astype(np.float32)
    return _crumbs(q.reshape(n, supers * 8, 32)), (d * scale).reshape(n, -1), (-(dmin * minimum)).reshape(n, -1)


def _five_bit(q: np.ndarray) -> np.ndarray:
    """Quants in [0, 31], [..., 32] -> [..., 20]: their fifth bits, then nibbles in Q4_1's order."""
    return np.concatenate([_bits(q >> 4), (q[..., :16] & 0x0F) | ((q[..., 16:] & 0x0F) << 4)], axis=-1)


def _bits(bit: np.ndarray) -> np.ndarray:
    """[..., 32] of 0 / 1 -> [..., 4]: bit i of the 32 is weight i's."""
    return np.packbits(bit.astype(np.uint8) & 1, axis=-1, bitorder="little")


def _crumbs(q: np.ndarray) -> np.ndarray:
    """[..., 32] in [0, 3] -> [..., 8]: byte i holds weights i, i + 8, i + 16, i + 24 at bits 0, 2, 4, 6."""
    q = q.astype(np.uint8)
    return q[..., 0:8] | (q[..., 8:16] << 2) | (q[..., 16:24] << 4) | (q[..., 24:32] << 6)
