"""GGUF's K-quants (Q4_K, Q6_K: super-blocks of 256 weights, the form most GGUF files on the Hub
take: Q4_K_M mixes them) unpacked at load into langrt's rows of 32-weight blocks with float32
scales, which kernels/cpu/quant_kernels.h multiplies like Q4_1 and Q8_0 blocks.

Q4_K: per super-block fp16 d and dmin, eight 6-bit scales and minimums packed in 12 bytes, 128
bytes of nibbles; sub-block s (32 weights) is d * scale[s] * q - dmin * min[s]. Q6_K: 128 bytes of
low nibbles, 64 of high 2-bit pairs, sixteen int8 scales, fp16 d; weight w is d * scale[w / 16] *
(q - 32). The unpacked scales (d * scale, -dmin * min) are exact in float32, so the values are
exactly GGUF's (tests/numerics/test_quant_linear.py checks them against gguf-py's).
"""

from __future__ import annotations

import numpy as np

Q4_K, Q6_K = 12, 14
SUPER_BLOCK = 256
SUPER_BYTES = {Q4_K: 144, Q6_K: 210}


def unpack(raw: np.ndarray, ggml_type: int, k: int) -> np.ndarray:
    """GGUF rows, uint8 [N, K / 256 * super-block bytes] -> langrt's rows, uint8 [N, K / 32 *
    (24 for Q4_K, 40 for Q6_K)]: each row's quants, then its float32 scales (and Q4_K's offsets)."""
    n, supers = raw.shape[0], k // SUPER_BLOCK
    if k % SUPER_BLOCK or raw.shape[1] != supers * SUPER_BYTES[ggml_type]:
        raise ValueError(f"{raw.shape[1]} bytes per row are not {k // SUPER_BLOCK} super-blocks of type {ggml_type}")
    blocks = raw.reshape(n, supers, SUPER_BYTES[ggml_type])
    parts = _unpack_q4_k(blocks) if ggml_type == Q4_K else _unpack_q6_k(blocks)
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(n, -1) for p in parts], axis=1)


def _fp16(column: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32)


def _unpack_q4_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """-> (nibbles [N, supers * 8, 16] in Q4_1's order: byte i holds weights i and i + 16 of its
    block; scales d * scale; offsets -dmin * min), the latter [N, supers * 8] float32."""
    n, supers = blocks.shape[:2]
    d, dmin = _fp16(blocks[..., 0:2]), _fp16(blocks[..., 2:4])
    scale, minimum = _scales_and_mins(blocks[..., 4:16])
    packed = blocks[..., 16:].reshape(n, supers, 4, 32)  # 4 x 64 weights: low nibbles, then high
    q = np.stack([packed & 0x0F, packed >> 4], axis=3).reshape(n, supers * 8, 32)
    nibbles = q[..., :16] | (q[..., 16:] << 4)
    return nibbles, (d * scale).reshape(n, -1), (-(dmin * minimum)).reshape(n, -1)


def _scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes -> 8 scales and 8 minimums of 6 bits: bytes 0-3 hold scales 0-3 (low 6 bits)
    and the top 2 bits of scales 4-7, bytes 4-7 the same for the minimums, bytes 8-11 the low 4
    bits of scales 4-7 (low nibble) and of minimums 4-7 (high nibble)."""
    first, second, low = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scale = np.concatenate([first & 0x3F, (low & 0x0F) | ((first >> 2) & 0x30)], axis=-1)
    minimum = np.concatenate([second & 0x3F, (low >> 4) | ((second >> 2) & 0x30)], axis=-1)
    return scale.astype(np.float32), minimum.astype(np.float32)


def _unpack_q6_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """-> (q - 32 as int8 [N, supers * 256] in weight order; scales d * scale [N, supers * 16])."""
    n, supers = blocks.shape[:2]
    low = blocks[..., :128].reshape(n, supers, 2, 64)  # per 128 weights: 64 bytes, low then high nibbles
    high = blocks[..., 128:192].reshape(n, supers, 2, 32)  # per 128 weights: 32 bytes, 4 x 2 bits
    lows = np.stack([low & 0x0F, low >> 4], axis=3).reshape(n, supers, 256)
    highs = np.stack([(high >> shift) & 0x03 for shift in (0, 2, 4, 6)], axis=3).reshape(n, supers, 256)
    q = (lows | (highs << 4)).astype(np.int8) - np.int8(32)
    scales = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.float32)
    d = _fp16(blocks[..., 208:210])
    return q.reshape(n, -1), (d * scales).reshape(n, -1)
