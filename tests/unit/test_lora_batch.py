"""LoraPass against a row-by-row reference: every row gets exactly its request's adapter's
product (or nothing), whatever order the requests' adapters come in."""

from __future__ import annotations

import random

import torch

from langrt.lora.adapter import LoraAdapter, ProjectionFactors
from langrt.model.lora_pass import LoraPass


def adapter(name: str, seed: int, width: int = 8, out: int = 6, rank: int = 2) -> LoraAdapter:
    gen = torch.Generator().manual_seed(seed)
    factors = {
        (0, "o"): ProjectionFactors(torch.randn(rank, width, generator=gen), torch.randn(out, rank, generator=gen))
    }
    return LoraAdapter(name, f"/{name}", rank, 1.0, ("o_proj",), factors, namespace=seed << 32)


def test_each_row_gets_its_adapters_product():
    rng = random.Random(0)
    adapters = [adapter("a", 1), adapter("b", 2), None]
    for _ in range(50):
        n = rng.randint(1, 6)
        chosen = [rng.choice(adapters) for _ in range(n)]
        lens = [rng.randint(1, 4) for _ in range(n)]
        x = torch.randn(sum(lens), 8)
        base = torch.randn(sum(lens), 6)
        lora = LoraPass.build(chosen, lens, torch.device("cpu"))
        expected = base.clone()
        owners = [a for a, k in zip(chosen, lens) for _ in range(k)]
        for row, owner in enumerate(owners):
            if owner is not None:
                f = owner.factors[(0, "o")]
                expected[row] += f.b @ (f.a @ x[row])
        if lora is None:
            assert all(a is None for a in chosen)
            continue
        got = lora.add(base.clone(), x, 0, "o")
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert torch.equal(lora.add(base.clone(), x, 1, "o"), base), "a layer the adapters do not target is untouched"


def test_stacked_adapters_of_different_ranks_and_targets():
    """Several adapters in a pass: where two or more target a projection their factors are
    stacked (one product for all rows, masked per row), else adapter by adapter; both give each
    row its own adapter's product."""
    import langrt.model.lora_pass as lora_pass

    gen = torch.Generator().manual_seed(5)
    a, b = adapter("a", 1, rank=2), adapter("b", 2, rank=3)
    b.factors[(0, "down")] = ProjectionFactors(torch.randn(4, 8, generator=gen), torch.randn(6, 4, generator=gen))
    chosen, lens = [a, None, b, a, b], [2, 1, 3, 1, 2]
    owners = [o for o, k in zip(chosen, lens) for _ in range(k)]
    x, base = torch.randn(9, 8, generator=gen), torch.randn(9, 6, generator=gen)
    lora = LoraPass.build(chosen, lens, torch.device("cpu"))
    assert lora._stack(0, "o") is not None and lora._stack(0, "down") is None  # b alone targets down
    for projection in ("o", "down"):
        expected = base.clone()
        for row, owner in enumerate(owners):
            f = owner.factors.get((0, projection)) if owner is not None else None
            if f is not None:
                expected[row] += f.b @ (f.a @ x[row])
        torch.testing.assert_close(lora.add(base.clone(), x, 0, projection), expected, rtol=1e-5, atol=1e-5)
    lora_pass._stacks.clear()
    saved, lora_pass.STACK_MAX_RANKS = lora_pass.STACK_MAX_RANKS, 4
    try:  # 5 ranks in all: adapter by adapter
        assert LoraPass.build(chosen, lens, torch.device("cpu"))._stack(0, "o") is None
    finally:
        lora_pass.STACK_MAX_RANKS = saved
        lora_pass._stacks.clear()
