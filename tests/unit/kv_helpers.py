"""Admission and policy tests' common ground: a real CacheManager over small CPU pools, real
Reqs, and cached prefixes left the way a finished request leaves them."""

from __future__ import annotations

import torch

from langrt.mem.cache_manager import CacheManager
from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from langrt.sampling.sampling_params import SamplingParams
from langrt.request import Req


def make_cache(slots: int = 256, rows: int = 4, radix: bool = True, context: int = 256) -> CacheManager:
    return CacheManager(
        ReqToTokenPool(rows, context, "cpu"), TokenToKVPool(slots, 1, 1, 2, torch.float32, "cpu"), radix=radix
    )


def make_req(rid: str, ids, max_new: int = 1) -> Req:
    return Req(rid, list(ids), SamplingParams(max_new_tokens=max_new))


def cache_prefix(cm: CacheManager, ids) -> None:
    """Leave `ids` in the prefix cache, unlocked: a request computed them and finished."""
    req = make_req("seed", ids)
    assert cm.open(req, cm.match(req.all_ids[: req.max_prefix_len]))
    assert cm.reserve(req, req.kv_len, req.seq_len - req.kv_len)
    req.kv_len = req.seq_len
    cm.release(req)
