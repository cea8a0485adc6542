"""A hierarchical KV cache (--hicache-size, --hicache-dir): what the radix tree evicts moves to
host memory and disk instead of vanishing, and a request whose prefix is there loads it back
into the pool instead of computing it again (docs/hicache.md).

    keys.py        block keys: model identity + the token prefix, chained per block
    block_file.py  the checked on-disk format of one block
    host_tier.py   a bounded LRU of blocks in one (pinned, on GPU) host buffer
    disk_tier.py   a bounded LRU of block files in a directory; atomic writes; survives restarts
    tiers.py       KVTiers: the contract the prefix cache uses; NoTiers, HiCache
"""

from __future__ import annotations

import math
from pathlib import Path

from langrt.mem.hicache.disk_tier import DiskTier
from langrt.mem.hicache.host_tier import HostTier
from langrt.mem.hicache.keys import KVIdentity, model_files
from langrt.mem.hicache.tiers import HiCache, KVTiers, NoTiers, block_shape

GB = 1 << 30
# The unit of lookup, storage and file. A returning prefix's last partial block is computed
# again, so smaller blocks reuse more of each prefix; larger ones mean fewer keys to hash and
# fewer, larger files. 32 tokens wastes at most 31 positions per prefix.
BLOCK_TOKENS = 32
# Serving settings that change the K/V a prefix gets (weights as loaded, numerics, layout).
_KV_SETTINGS = (
    "load_format",
    "model_impl",
    "dtype",
    "device",
    "attention_backend",
    "quantization",
    "cpu_dense_copy",
    "enable_torch_compile",
    "tp_size",
)


def create_tiers(args, runner) -> KVTiers:
    """The tiers --hicache-size / --hicache-dir ask for over a ModelRunner's KV pool (NoTiers
    without them); raises ValueError, naming the flag, where they cannot work."""
    if not args.hicache_size and args.hicache_dir is None:
        return NoTiers()
    kv_pool = runner.kv_pool
    if kv_pool.window is not None:
        raise ValueError(
            "--hicache-size / --hicache-dir: this model has sliding-window layers, whose K/V lives in a "
            "second pool the tiers do not save yet; serve it without --hicache-size and --hicache-dir"
        )
    shape = block_shape(kv_pool, BLOCK_TOKENS)
    block_bytes = math.prod(shape) * kv_pool.k_buffers[0].element_size()
    host = None
    if args.hicache_size:
        blocks = int(args.hicache_size * GB) // block_bytes
        if blocks == 0:
            raise ValueError(
                f"--hicache-size {args.hicache_size} GB holds no block of this model's K/V "
                f"({block_bytes} bytes for {BLOCK_TOKENS} tokens); give it more"
            )
        host = HostTier(blocks, shape, kv_pool.dtype, pin=kv_pool.device.type == "cuda")
    disk = DiskTier(args.hicache_dir, int(args.hicache_disk_size * GB)) if args.hicache_dir else None
    return HiCache(kv_pool, kv_identity(args, kv_pool).namespace, BLOCK_TOKENS, host, disk)


def kv_identity(args, kv_pool) -> KVIdentity:
    from langrt.builtin import builtin_model_path
    from langrt.version import __version__

    settings = {name: str(getattr(args, name)) for name in _KV_SETTINGS}
    settings["langrt"] = __version__
    if args.load_format == "dummy":
        settings["random_seed"] = str(args.random_seed)
    k = kv_pool.k_buffers[0]
    return KVIdentity(
        model_files=model_files(Path(args.model_path) if args.model_path else builtin_model_path()),
        settings=tuple(sorted(settings.items())),
        num_layers=len(kv_pool.k_buffers),
        num_kv_heads=k.shape[1],
        head_dim=k.shape[2],
        dtype=str(kv_pool.dtype),
        block_tokens=BLOCK_TOKENS,
    )


__all__ = ["BLOCK_TOKENS", "HiCache", "KVTiers", "NoTiers", "create_tiers", "kv_identity"]
