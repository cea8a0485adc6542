"""The cache-aware scheduler on a tiny random Llama: reuse, pressure, chunking, policies."""

from __future__ import annotations

import random

import pytest
import torch

import langrt
from langrt.request import Req
from runner_driver import make_scheduler
from langrt.sampling.sampling_params import SamplingParams


SETTINGS = dict(dtype="float32", max_total_tokens=32768, context_length=2048, log_level="warning")


@pytest.fixture
def make_engine(new_engine):
    return lambda path, **kw: new_engine(path, **{**SETTINGS, **kw})


@pytest.fixture(scope="module")
def engines(tiny_llama_dir):
    on = langrt.Engine(str(tiny_llama_dir), **SETTINGS)
    off = langrt.Engine(str(tiny_llama_dir), disable_radix_cache=True, **SETTINGS)
    yield on, off
    on.shutdown()
    off.shutdown()


def tokens(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(17, 49152, (n,), generator=gen).tolist()


def greedy(new_tokens: int, **kw) -> dict:
    return {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True, **kw}


def ids_of(outs) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


def assert_idle_and_clean(engine):
    stats = engine.cache_stats()
    assert stats["kv_available_tokens"] == stats["kv_total_tokens"], "a slot leaked or stayed locked"
    assert stats["running_requests"] == stats["waiting_requests"] == 0


def test_shared_prefix_same_outputs_and_reuse(engines):
    on, off = engines
    on.flush_cache()
    prefix = tokens(0, 600)
    prompts = [prefix + tokens(100 + i, 5) for i in range(32)]
    with_cache = on.generate(input_ids=prompts, sampling_params=greedy(8))
    without = off.generate(input_ids=prompts, sampling_params=greedy(8))
    assert ids_of(with_cache) == ids_of(without)
    cached = sorted(o["meta_info"]["cached_tokens"] for o in with_cache)
    assert cached[0] == 0, "the first request computes the prefix"
    assert all(c >= 0.95 * 600 for c in cached[1:]), cached
    assert all(o["meta_info"]["cached_tokens"] == 0 for o in without)
    assert_idle_and_clean(on)
    assert_idle_and_clean(off)


def test_four_turn_conversation(engines):
    on, off = engines
    on.flush_cache()
    histories = {"on": tokens(1, 40), "off": tokens(1, 40)}
    for turn in range(4):
        outs = {}
        for name, engine in (("on", on), ("off", off)):
            outs[name] = engine.generate(input_ids=histories[name], sampling_params=greedy(6))
            histories[name] = histories[name] + outs[name]["output_ids"] + tokens(10 + turn, 30)
        assert outs["on"]["output_ids"] == outs["off"]["output_ids"]
        if turn:
            # Everything before this turn's new user text was computed last turn (but the last
            # generated token, which never got K/V).
            prev_len = outs["on"]["meta_info"]["prompt_tokens"] - 30 - 1
            assert outs["on"]["meta_info"]["cached_tokens"] >= prev_len


def test_n_continuations_of_one_prefix(engines):
    on, off = engines
    prompt = tokens(2, 200)
    for params in (greedy(10, n=4), {"max_new_tokens": 10, "n": 4, "seed": 5, "temperature": 0.9}):
        a = on.generate(input_ids=prompt, sampling_params=params)
        b = off.generate(input_ids=prompt, sampling_params=params)
        assert ids_of(a) == ids_of(b)
    assert_idle_and_clean(on)


def test_kv_pressure_retracts_and_finishes_everything(tiny_llama_dir, make_engine):
    prompts = [tokens(200 + i, 100) for i in range(32)]
    params = greedy(400)
    big = make_engine(tiny_llama_dir).generate(input_ids=prompts, sampling_params=params)
    small_engine = make_engine(tiny_llama_dir, max_total_tokens=2048)
    small = small_engine.generate(input_ids=prompts, sampling_params=params)
    assert small_engine.cache_stats()["retractions"] > 0, "the pool was meant to run out"
    assert [o["meta_info"]["completion_tokens"] for o in small] == [400] * 32
    assert ids_of(small) == ids_of(big)
    assert_idle_and_clean(small_engine)


def test_a_request_as_long_as_the_pool_fits_its_table_row(tiny_llama_dir):
    """Each request's row of positions -> slots is as long as the pool, not the context (a
    request's positions each hold a slot at once): a request filling the whole pool still runs,
    and one that cannot fit is refused before it reaches the table."""
    scheduler = make_scheduler(tiny_llama_dir, max_total_tokens=256, context_length=2048)
    assert scheduler.runner.req_pool.req_to_token.shape[1] == 256
    req = Req("full", tokens(6, 200), SamplingParams(max_new_tokens=56, temperature=0, ignore_eos=True))
    scheduler.add_request(req)
    while scheduler.has_work:
        scheduler.step()
    assert len(req.output_ids) == 56 and req.finish_reason is not None
    with pytest.raises(langrt.errors.InvalidRequest):
        scheduler.add_request(Req("long", tokens(7, 300), SamplingParams(max_new_tokens=4)))


def test_chunked_prefill_matches_whole_prefill(tiny_llama_dir, make_engine):
    prompt = tokens(3, 1500)
    kwargs = dict(input_ids=prompt, sampling_params=greedy(8), return_logprob=True, logprob_start_len=0)
    whole = make_engine(tiny_llama_dir, chunked_prefill_size=-1).generate(**kwargs)
    chunked = make_engine(tiny_llama_dir, chunked_prefill_size=128).generate(**kwargs)
    assert chunked["output_ids"] == whole["output_ids"]
    a = [e[0] for e in whole["meta_info"]["input_token_logprobs"][1:]]
    b = [e[0] for e in chunked["meta_info"]["input_token_logprobs"][1:]]
    assert len(a) == len(b) == 1499
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4


def test_decode_keeps_going_while_a_long_prompt_is_chunked(tiny_llama_dir):
    scheduler = make_scheduler(tiny_llama_dir, chunked_prefill_size=128, max_total_tokens=8192, context_length=2048)
    short = Req("short", tokens(4, 10), SamplingParams(max_new_tokens=100, temperature=0, ignore_eos=True))
    long = Req("long", tokens(5, 1000), SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True))
    scheduler.add_request(short)
    scheduler.step()
    scheduler.add_request(long)
    steps = 0
    while not long.output_ids:
        before = len(short.output_ids)
        scheduler.step()
        steps += 1
        assert len(short.output_ids) == before + 1, "a decode step was skipped for the prefill"
    assert steps == -(-1000 // 128), "one 128-token chunk per step"


def test_prefill_only_requests_share_their_prefix(engines):
    on, off = engines
    on.flush_cache()
    prefix = tokens(6, 300)
    choices = [tokens(60 + i, 3 + i) for i in range(4)]
    kwargs = dict(
        input_ids=[prefix + c for c in choices],
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=300,
    )
    a = on.generate(**kwargs)
    b = off.generate(**kwargs)
    for x, y, c in zip(a, b, choices):
        assert x["text"] == "" and x["meta_info"]["completion_tokens"] == 0
        lp_x = [e[0] for e in x["meta_info"]["input_token_logprobs"]]
        lp_y = [e[0] for e in y["meta_info"]["input_token_logprobs"]]
        assert len(lp_x) == len(c) and max(abs(p - q) for p, q in zip(lp_x, lp_y)) < 1e-4
    cached = sorted(o["meta_info"]["cached_tokens"] for o in a)
    assert cached[0] == 0 and all(c >= 299 for c in cached[1:]), cached
    assert_idle_and_clean(on)


def prefix_groups(groups: int, per_group: int, prefix_len: int, seed: int = 0) -> list[list[int]]:
    prompts = [
        tokens(1000 + g, prefix_len) + tokens(2000 + g * per_group + i, 8)
        for g in range(groups)
        for i in range(per_group)
    ]
    random.Random(seed).shuffle(prompts)
    return prompts


def optimal_hit_rate(prompts: list[list[int]]) -> float:
    """Offline optimum with unlimited cache: every distinct prefix computed exactly once."""
    distinct = {tuple(p[: i + 1]) for p in prompts for i in range(len(p))}
    total = sum(map(len, prompts))
    return (total - len(distinct)) / total


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight", "fcfs", "random"])
def test_policies_agree_on_outputs_and_lpm_is_near_optimal(tiny_llama_dir, make_engine, engines, policy):
    prompts = prefix_groups(8, 16, 200)
    engine = make_engine(tiny_llama_dir, schedule_policy=policy, max_total_tokens=4096)
    outs = engine.generate(input_ids=prompts, sampling_params=greedy(4))
    reference = engines[1].generate(input_ids=prompts, sampling_params=greedy(4))
    assert ids_of(outs) == ids_of(reference)
    hit_rate = engine.cache_stats()["cache_hit_rate"]
    if policy in ("lpm", "dfs-weight"):
        assert hit_rate >= 0.95 * optimal_hit_rate(prompts), (hit_rate, optimal_hit_rate(prompts))
    assert_idle_and_clean(engine)


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_policies_under_eviction_pressure_give_the_uncached_outputs(tiny_llama_dir, make_engine, engines, policy):
    """A pool with room for about three of eight groups' prefixes: each step's admissions evict
    prefixes that later requests of the same step had matched when the policy ordered them. A
    request must never adopt an evicted prefix (its slots then hold another request's K/V)."""
    prompts = prefix_groups(8, 16, 300)
    engine = make_engine(tiny_llama_dir, schedule_policy=policy, max_total_tokens=1500)
    outs = engine.generate(input_ids=prompts, sampling_params=greedy(4))
    assert engine.cache_stats()["evicted_tokens"] > 0, "the pool was under pressure"
    reference = engines[1].generate(input_ids=prompts, sampling_params=greedy(4))
    assert ids_of(outs) == ids_of(reference)
    assert_idle_and_clean(engine)


def test_flush_cache_forgets_prefixes(engines):
    on, _ = engines
    prompt = tokens(7, 100)
    on.generate(input_ids=prompt, sampling_params=greedy(2))
    assert on.generate(input_ids=prompt, sampling_params=greedy(2))["meta_info"]["cached_tokens"] == 99
    assert on.flush_cache()
    assert on.cache_stats()["kv_cached_tokens"] == 0
    assert on.generate(input_ids=prompt, sampling_params=greedy(2))["meta_info"]["cached_tokens"] == 0


def test_flush_is_refused_while_requests_wait(tiny_llama_dir):
    scheduler = make_scheduler(tiny_llama_dir, max_total_tokens=4096, context_length=512)
    scheduler.add_request(Req("w", tokens(8, 10), SamplingParams(max_new_tokens=2)))
    assert not scheduler.flush_cache()
    while scheduler.has_work:
        scheduler.step()
    assert scheduler.flush_cache()
