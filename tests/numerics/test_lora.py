"""LoRA adapters: each request's output equals transformers + peft with its adapter merged;
requests with different adapters (and none) in one batch give what each gives alone; the prefix
cache never shares K/V across adapters."""

from __future__ import annotations

import pytest
import torch

from langrt.errors import InvalidRequest
from langrt.lora import LoraError
from langrt.messages import RequestOptions
from langrt.sampling.sampling_params import SamplingParams
from langrt.request import Req
from lora_utils import merged_greedy, write_adapter
from runner_driver import make_scheduler, run_requests

NEW_TOKENS = 8
SETTINGS = dict(max_total_tokens=4096, context_length=512)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def base_and_adapters(request, tmp_path_factory, tiny_model_builder):
    root = tmp_path_factory.mktemp(f"lora_{request.param}")
    tiny_model_builder(request.param, root / "base", seed=3)
    a = write_adapter(root / "base", root / "a", seed=1)
    b = write_adapter(root / "base", root / "b", seed=2, rank=8, alpha=16, targets=["q_proj", "v_proj", "down_proj"])
    return root / "base", {"a": a, "b": b}


def scheduler_for(base, adapters, **kw):
    paths = tuple(f"{name}={path}" for name, path in adapters.items())
    return make_scheduler(base, lora_paths=paths, **{**SETTINGS, **kw})


def prompt(seed: int, n: int = 12) -> list[int]:
    return torch.randint(17, 49152, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def req(rid: str, ids: list[int], lora: str | None) -> Req:
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    return Req(rid, list(ids), params, RequestOptions(lora_path=lora))


def test_each_adapter_matches_peft_merged(base_and_adapters):
    base, adapters = base_and_adapters
    scheduler = scheduler_for(base, adapters)
    ids = prompt(0)
    for name in ["a", "b", None]:
        (out,) = run_requests(scheduler, [req(f"r-{name}", ids, name)])
        assert out == merged_greedy(base, adapters.get(name), ids, NEW_TOKENS), f"adapter {name}"


def test_adapters_change_the_output(base_and_adapters):
    """Guards the test above: were the adapters no-ops, it would pass with LoRA ignored."""
    base, adapters = base_and_adapters
    ids = prompt(0)
    outs = [merged_greedy(base, adapters.get(n), ids, NEW_TOKENS) for n in ["a", "b", None]]
    assert outs[0] != outs[2] and outs[1] != outs[2] and outs[0] != outs[1]


def test_mixed_batch_equals_each_alone(base_and_adapters):
    base, adapters = base_and_adapters
    names = ["a", None, "b", "a", "b", None]
    prompts = [prompt(10 + i, 6 + 3 * i) for i in range(len(names))]
    one_at_a_time = scheduler_for(base, adapters, disable_radix_cache=True)
    alone = [
        run_requests(one_at_a_time, [req(f"alone{i}", ids, name)])[0]
        for i, (ids, name) in enumerate(zip(prompts, names))
    ]
    mixed = [req(f"mixed{i}", ids, name) for i, (ids, name) in enumerate(zip(prompts, names))]
    assert run_requests(scheduler_for(base, adapters), mixed) == alone


def test_cache_never_shares_a_prefix_across_adapters(base_and_adapters):
    base, adapters = base_and_adapters
    scheduler = scheduler_for(base, adapters)
    ids = prompt(5, 40)
    first = [req(f"first-{n}", ids, n) for n in ["a", "b", None]]
    for r in first:
        run_requests(scheduler, [r])
    assert [r.cached_tokens for r in first] == [0, 0, 0], "another adapter's (or the base's) K/V was reused"
    again = [req(f"again-{n}", ids, n) for n in ["a", "b", None]]
    outs = [run_requests(scheduler, [r])[0] for r in again]
    assert all(r.cached_tokens >= len(ids) - 1 for r in again), "the same adapter's prefix is reused"
    assert outs == [r.output_ids for r in first]


def test_cap_on_adapters_per_batch_keeps_outputs(base_and_adapters):
    base, adapters = base_and_adapters
    names = ["a", "b", "a", "b"]
    prompts = [prompt(30 + i) for i in range(4)]
    capped = run_requests(
        scheduler_for(base, adapters, max_loras_per_batch=1),
        [req(f"c{i}", p, n) for i, (p, n) in enumerate(zip(prompts, names))],
        stagger=False,
    )
    free = run_requests(
        scheduler_for(base, adapters),
        [req(f"f{i}", p, n) for i, (p, n) in enumerate(zip(prompts, names))],
        stagger=False,
    )
    assert capped == free


def test_unknown_adapter_is_refused_by_name(base_and_adapters):
    base, adapters = base_and_adapters
    scheduler = scheduler_for(base, adapters)
    with pytest.raises(InvalidRequest, match="unknown LoRA adapter 'nope'.*loaded: a, b"):
        scheduler.add_request(req("x", prompt(1), "nope"))


def test_load_and_unload_at_run_time(base_and_adapters):
    base, adapters = base_and_adapters
    scheduler = scheduler_for(base, {})
    ids = prompt(0)
    scheduler.loras.load("late", str(adapters["a"]))
    (out,) = run_requests(scheduler, [req("late1", ids, "late")])
    assert out == merged_greedy(base, adapters["a"], ids, NEW_TOKENS)
    scheduler.loras.unload("late")
    with pytest.raises(InvalidRequest, match="unknown LoRA adapter 'late'"):
        scheduler.add_request(req("late2", ids, "late"))
    scheduler.loras.load("late", str(adapters["b"]))  # same name, other weights: no stale cache
    r = req("late3", ids, "late")
    (out,) = run_requests(scheduler, [r])
    assert r.cached_tokens == 0 and out == merged_greedy(base, adapters["b"], ids, NEW_TOKENS)


def test_adapter_for_another_model_is_refused(base_and_adapters, tmp_path, tiny_model_builder):
    base, _ = base_and_adapters
    tiny_model_builder("llama", tmp_path / "wide", hidden_size=96)
    wrong = write_adapter(tmp_path / "wide", tmp_path / "wide_lora", seed=1)
    scheduler = scheduler_for(base, {})
    with pytest.raises(LoraError, match="do not fit the base model"):
        scheduler.loras.load("wrong", str(wrong))


@pytest.mark.slow
def test_builtin_model_with_an_adapter_matches_peft_merged(smollm_path, tmp_path):
    """The built-in GGUF model, dequantized (as transformers reads the file), with an adapter
    peft wrote onto that model: greedy outputs equal, and differ from the base model's."""
    adapter = write_adapter(smollm_path, tmp_path / "smol_lora", seed=4, rank=8, alpha=16, scale=0.05)
    scheduler = make_scheduler(smollm_path, quantization="none", lora_paths=(f"smol={adapter}",), **SETTINGS)
    ids = prompt(7, 16)
    with_adapter, base = run_requests(scheduler, [req("smol", ids, "smol"), req("plain", ids, None)])
    assert with_adapter == merged_greedy(smollm_path, adapter, ids, NEW_TOKENS)
    assert base == merged_greedy(smollm_path, None, ids, NEW_TOKENS) != with_adapter
