"""The shared-memory all-reduce of tensor-parallel ranks (langrt/parallel/shm.py), in two real
processes joined by gloo: sums equal gloo's (float32 exactly: two ranks), the same bits on every
rank, strided tensors too, tensors over a slot fall back to gloo, nothing is left in /dev/shm,
and a rank whose peer has died raises instead of waiting forever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from langrt.parallel import shm

pytestmark = pytest.mark.skipif(not shm.usable(), reason="no /dev/shm, or not x86-64")

RANK = textwrap.dedent(
    """
    import json, os, sys, time, torch, torch.distributed as dist
    from langrt.parallel.group import TensorParallel
    rank, init_file, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    tp = TensorParallel(rank, 2, "cpu", init_file)
    assert tp.shm is not None
    if mode == "die":
        if rank == 1:
            os._exit(0)
        time.sleep(0.5)
        try:
            tp.all_reduce(torch.ones(4))
        except RuntimeError as e:
            print(json.dumps({"error": str(e)}))
        os._exit(0)
    gen = torch.Generator().manual_seed(rank)
    out = {}
    cases = [("small", (3, 576), torch.float32), ("bf16", (2, 64), torch.bfloat16), ("big", (600, 576), torch.float32), ("strided", (576, 3), torch.float32)]
    for name, shape, dtype in cases:
        x = torch.randn(shape, generator=gen).to(dtype)
        x = x.t() if name == "strided" else x
        mine = x.clone()
        assert tp.shm.fits(x) == (name != "big")
        for _ in range(3):  # both slot sets, reused
            y = tp.all_reduce(x.clone())
        parts = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(parts, mine)
        want = (parts[0].float() + parts[1].float()).to(dtype)
        out[name] = [torch.equal(y, want), y.float().sum().item()]
    print(json.dumps(out))
    os._exit(0)
    """
)


def _run(tmp_path: Path, mode: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    init = tmp_path / "rendezvous"
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(init), mode], stdout=subprocess.PIPE, text=True, env=env)
             for r in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=60)[0] for p in procs]
    return [json.loads(o.strip().splitlines()[-1]) if o.strip() else {} for o in outs]


def test_sums_equal_gloo_on_every_rank_and_nothing_is_left(tmp_path):
    before = set(os.listdir("/dev/shm"))
    zero, one = _run(tmp_path, "sum")
    for name in ("small", "bf16", "big", "strided"):
        assert zero[name][0] and one[name][0], name
        assert zero[name][1] == one[name][1], "every rank gets the same bits"
    assert not [f for f in set(os.listdir("/dev/shm")) - before if f.startswith("langrt-tp-")]


def test_a_dead_peer_raises_instead_of_waiting_forever(tmp_path):
    zero, _ = _run(tmp_path, "die")
    assert "has exited" in zero["error"]
