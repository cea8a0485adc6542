"""N-gram speculative decoding through the scheduler and the engine: outputs are token for token
what they are without it (float32: the products of a row do not depend on the pass's other
rows), with drafts kept, under continuous batching (requests with and without drafts in one
pass), constrained decoding, the radix cache and retraction; and its figures on meta_info and
/metrics."""

from __future__ import annotations

import pytest
import torch

import langrt
from langrt.sampling.sampling_params import SamplingParams
from langrt.request import Req
from runner_driver import make_scheduler, run_requests
from server_utils import LaunchedServer

NGRAM = dict(speculative_algorithm="NGRAM")
EXTRACTION = (
    "The Harbor Museum opened in 1921 on Pier Street. Its first director was Clara Mendez, who collected maps of "
    "the old coast. In 1958 the museum added a wing for ships in bottles, designed by the architect Jonas Werth. "
    "Today the collection holds 4,200 maps, 310 model ships and the logbook of the schooner Evening Star.\n\n"
    "Copy the text above word for word."
)


def tokens(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(17, 49152, (n,), generator=gen).tolist()


def mixed_requests() -> list[Req]:
    """Greedy and sampled, constrained and free, stopped by a token or by length; prompts that
    repeat themselves (n-grams to match) and prompts that do not."""
    looped = tokens(1, 24) * 3
    specs = [
        (looped, dict(temperature=0.0)),
        (tokens(2, 40), dict(temperature=0.0)),
        (looped[:50], dict(temperature=0.1, seed=11)),  # a peaked distribution: drafts kept
        (tokens(3, 30) * 2, dict(temperature=1.0, top_k=20, seed=5)),
        (looped, dict(temperature=0.0, regex=r"[ab]{1,300}")),  # few tokens allowed: it soon loops
        (tokens(4, 20) * 2, dict(temperature=0.0, repetition_penalty=1.3)),
        (looped[10:], dict(temperature=0.0, stop_token_ids=[looped[30]])),
    ]
    return [Req(f"r{i}", list(p), SamplingParams(max_new_tokens=48, **kw)) for i, (p, kw) in enumerate(specs)]


@pytest.fixture(scope="module")
def tiny_qwen2_dir(tmp_path_factory, tiny_model_builder):
    path = tmp_path_factory.mktemp("tiny_qwen2_spec")
    tiny_model_builder("qwen2", path, seed=3)
    return path


@pytest.mark.parametrize("model", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_outputs_are_the_same_with_and_without_ngram_drafts(model, request):
    """Two waves of the same requests: in the second, drafts also come from the first wave's
    outputs (recent outputs), so every kind of request keeps some, even on a model whose own
    text never repeats."""
    path = request.getfixturevalue(model)
    settings = dict(max_total_tokens=8192, context_length=1024)
    plain = run_requests(make_scheduler(path, **settings), mixed_requests())
    scheduler = make_scheduler(path, **settings, **NGRAM)
    first = mixed_requests()
    assert run_requests(scheduler, first) == plain
    second = mixed_requests()
    assert run_requests(scheduler, second) == plain
    stats = scheduler.stats
    assert stats.spec_accepted_tokens > 0 and stats.spec_draft_tokens > stats.spec_accepted_tokens, "kept some, not all"
    assert sum(r.spec_accepted_tokens for r in first + second) == stats.spec_accepted_tokens
    assert all(r.spec_accepted_tokens > 0 for r in second[:5]), "greedy, sampled and constrained requests kept drafts"
    assert stats.forward_passes < 2 * sum(len(o) for o in plain), "drafts saved passes"
    assert scheduler.cache.available == scheduler.cache.size, "every draft's slot given back"


def test_the_radix_cache_and_retraction_change_nothing(tiny_llama_dir):
    """A pool too small for all of them at once: requests are retracted and resume (their
    drafts dropped first); the second wave re-matches cached prefixes."""
    prompts = [tokens(20 + i, 30) * 3 for i in range(8)]

    def wave(scheduler):
        reqs = [
            Req(f"w{i}", list(p), SamplingParams(max_new_tokens=160, temperature=0.0, ignore_eos=True))
            for i, p in enumerate(prompts)
        ]
        return run_requests(scheduler, reqs, stagger=False)

    reference = wave(make_scheduler(tiny_llama_dir, max_total_tokens=16384, context_length=1024))
    small = make_scheduler(tiny_llama_dir, max_total_tokens=1024, context_length=1024, **NGRAM)
    assert wave(small) == reference
    assert small.stats.retractions > 0, "the pool was meant to run out"
    assert small.stats.spec_accepted_tokens > 0
    cached = small.stats.cached_tokens
    assert wave(small) == reference
    assert small.stats.cached_tokens > cached, "the second wave reused cached prefixes"
    assert small.cache.available == small.cache.size


@pytest.fixture(scope="module")
def smollm_engines():
    settings = dict(log_level="warning", max_total_tokens=8192, dtype="float32")
    with langrt.Engine(**settings, **NGRAM) as on, langrt.Engine(**settings) as off:
        yield on, off


def test_smollm_greedy_outputs_are_the_same_and_copying_is_drafted(smollm_engines):
    on, off = smollm_engines
    tokenizer = on.tokenizer
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
        for c in (EXTRACTION, "What is the capital of France?", "Write a short poem about the sea.")
    ]
    params = {"max_new_tokens": 64, "temperature": 0}
    with_drafts, without = on.generate(prompts, params), off.generate(prompts, params)
    assert [o["output_ids"] for o in with_drafts] == [o["output_ids"] for o in without]
    assert "Jonas Werth" in with_drafts[0]["text"]
    copied = with_drafts[0]["meta_info"]["spec_accepted_tokens"]
    assert copied >= with_drafts[0]["meta_info"]["completion_tokens"] // 2, "most of a copy comes from drafts"
    assert all("spec_accepted_tokens" not in o["meta_info"] for o in without), "reported only with speculation on"
    stats = on.cache_stats()
    assert stats["spec_accept_length"] > 2.0 and 0 < stats["spec_accept_rate"] <= 1.0


def test_metrics_and_meta_info_over_http(tiny_llama_dir):
    server = LaunchedServer("--model-path", str(tiny_llama_dir), "--max-total-tokens", "4096",
                            "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4")  # fmt: skip
    try:
        status, out = server.post(
            "/generate", {"input_ids": tokens(7, 20) * 3, "sampling_params": {"max_new_tokens": 40, "temperature": 0}}
        )
        assert status == 200 and out["meta_info"]["spec_accepted_tokens"] >= 0
        status, text = server.get("/metrics")
        assert status == 200
        values = {
            line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and not line.startswith("#")
        }
        assert values["langrt_spec_accepted_tokens"] == out["meta_info"]["spec_accepted_tokens"]
        assert values["langrt_spec_accept_length"] >= 1.0 or values["langrt_spec_draft_tokens"] == 0
        assert any(k.startswith("sglang:spec_accept_length{") for k in values)
        assert any(k.startswith("sglang:spec_accept_rate{") for k in values)
    finally:
        assert server.stop() == 0
