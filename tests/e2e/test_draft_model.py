"""Draft-model speculative decoding (--speculative-algorithm DRAFT) through the scheduler and the
engine: greedy outputs token for token what they are without it (float32), on tiny random models
and on SmolLM2 with a draft made of its own first layers, under continuous batching, grammars,
the radix cache and retraction, with every KV slot of both models given back; sampled outputs
follow the target's distribution exactly (rejection sampling), where keeping the drafts naively
does not; a draft with another vocabulary is refused."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections import Counter

import pytest
import torch

import langrt
import langrt.scheduler.token_emitter as token_emitter
from langrt.errors import ModelLoadError
from langrt.sampling.sampler import SamplingBatch
from langrt.sampling.sampling_params import SamplingParams
from langrt.request import Req
from langrt.speculative import write_truncated_model
from runner_driver import make_scheduler, run_requests

SETTINGS = dict(max_total_tokens=8192, context_length=1024)


def draft(path) -> dict:
    return dict(speculative_algorithm="DRAFT", speculative_draft_model_path=str(path))


def tokens(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(17, 49152, (n,), generator=gen).tolist()


def mixed_requests() -> list[Req]:
    """Greedy requests, free and constrained, stopped by a token or by length, penalized; and
    sampled ones (their drafts judged by rejection sampling), one of them constrained. The
    greedy ones come first (GREEDY of them)."""
    looped = tokens(1, 24) * 3
    specs = [
        (looped, {}),
        (tokens(2, 40), {}),
        (looped, dict(regex=r"[ab]{1,300}")),
        (tokens(4, 20) * 2, dict(repetition_penalty=1.3, frequency_penalty=0.5)),
        (looped[10:], dict(stop_token_ids=[looped[30]])),
        (tokens(5, 30), dict(min_new_tokens=10)),
        (looped[:50], dict(temperature=0.7, top_p=0.9, seed=3)),
        (looped, dict(temperature=1.0, regex=r"[ab]{1,300}")),
        (tokens(6, 30), dict(temperature=0.8, top_k=20, presence_penalty=0.5, min_p=0.05)),
    ]
    return [
        Req(f"m{i}", list(p), SamplingParams(max_new_tokens=40, **{"temperature": 0.0, **kw}))
        for i, (p, kw) in enumerate(specs)
    ]


GREEDY = 6


def all_slots_back(scheduler) -> bool:
    drafts = scheduler.emitter.drafter.speculative[0].cache
    return scheduler.cache.available == scheduler.cache.size and drafts.available == drafts.size


@pytest.fixture(scope="module")
def llama_drafts(tmp_path_factory, tiny_llama_dir, tiny_model_builder):
    """Two drafts of the tiny Llama: its own first layer (close to it), and an unrelated
    smaller random model (far from it)."""
    truncated = write_truncated_model(tiny_llama_dir, tmp_path_factory.mktemp("llama_first_layer"), 1)
    other = tmp_path_factory.mktemp("other_random_draft")
    tiny_model_builder("llama", other, seed=9, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    return {"truncated": truncated, "random": other}


# Most of this file's time (two long mixed batches per draft kind): slow, run by CI.
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["truncated", "random"])
def test_greedy_outputs_are_the_same_with_and_without_a_draft_model(kind, tiny_llama_dir, llama_drafts):
    """Greedy and sampled requests in one batch, joining while others decode: the greedy outputs
    are those without speculation (float32: a row's products do not depend on the pass's other
    rows), the sampled constrained one matches its regex, every slot of both models comes back."""
    plain = run_requests(make_scheduler(tiny_llama_dir, **SETTINGS), mixed_requests())
    scheduler = make_scheduler(tiny_llama_dir, **SETTINGS, **draft(llama_drafts[kind]))
    reqs = mixed_requests()
    outputs = run_requests(scheduler, reqs)
    assert outputs[:GREEDY] == plain[:GREEDY]
    assert re.fullmatch(r"[ab]{1,300}", scheduler.tokenizer.decode(outputs[7], skip_special_tokens=True))
    assert all(r.finished and len(r.output_ids) <= 40 for r in reqs)
    stats = scheduler.stats
    assert stats.spec_verifications > 0 and stats.spec_draft_tokens > stats.spec_accepted_tokens
    if kind == "truncated":
        assert stats.spec_accepted_tokens > 0 and stats.forward_passes < sum(len(o) for o in plain)
        assert all(r.spec_accepted_tokens > 0 for r in reqs[6:8]), "sampled requests kept drafts"
    assert sum(r.spec_accepted_tokens for r in reqs) == stats.spec_accepted_tokens
    assert all_slots_back(scheduler), "every KV slot of both models given back or cached"


def test_without_the_radix_cache_the_draft_keeps_no_prefixes_either(tiny_llama_dir, llama_drafts):
    settings = dict(SETTINGS, disable_radix_cache=True)
    plain = run_requests(make_scheduler(tiny_llama_dir, **settings), mixed_requests()[:3])
    scheduler = make_scheduler(tiny_llama_dir, **settings, **draft(llama_drafts["truncated"]))
    assert run_requests(scheduler, mixed_requests()[:3]) == plain
    drafts = scheduler.emitter.drafter.speculative[0].cache
    assert scheduler.stats.spec_accepted_tokens > 0 and drafts.stats()["kv_cached_tokens"] == 0
    assert all_slots_back(scheduler) and drafts.free_slots == drafts.size


def test_a_qwen2_target_with_its_first_layer_as_draft(tmp_path, tiny_qwen2_dir):
    truncated = write_truncated_model(tiny_qwen2_dir, tmp_path / "draft", 1)
    plain = run_requests(make_scheduler(tiny_qwen2_dir, **SETTINGS), mixed_requests())
    scheduler = make_scheduler(tiny_qwen2_dir, **SETTINGS, **draft(truncated))
    assert run_requests(scheduler, mixed_requests())[:GREEDY] == plain[:GREEDY]
    assert scheduler.stats.spec_accepted_tokens > 0
    assert all_slots_back(scheduler)


def test_the_radix_cache_and_retraction_change_nothing(tiny_llama_dir, llama_drafts):
    """A pool too small for all requests at once: they are retracted and resume; the second
    wave re-matches cached prefixes in both models' caches."""
    prompts = [tokens(20 + i, 30) * 3 for i in range(8)]

    def wave(scheduler):
        reqs = [
            Req(f"w{i}", list(p), SamplingParams(max_new_tokens=160, temperature=0.0, ignore_eos=True))
            for i, p in enumerate(prompts)
        ]
        return run_requests(scheduler, reqs, stagger=False)

    reference = wave(make_scheduler(tiny_llama_dir, max_total_tokens=16384, context_length=1024))
    small = make_scheduler(
        tiny_llama_dir, max_total_tokens=1024, context_length=1024, **draft(llama_drafts["truncated"])
    )
    assert wave(small) == reference
    assert small.stats.retractions > 0, "the pool was meant to run out"
    assert small.stats.spec_accepted_tokens > 0
    drafts = small.emitter.drafter.speculative[0].cache
    cached, evicted = small.stats.cached_tokens, drafts.stats()["evicted_tokens"]
    assert wave(small) == reference
    assert small.stats.cached_tokens > cached, "the second wave reused the target's cached prefixes"
    assert drafts.stats()["kv_cached_tokens"] > 0 and drafts.stats()["evicted_tokens"] >= evicted
    assert all_slots_back(small)
    assert small.flush_cache() and drafts.stats()["kv_cached_tokens"] == 0, "flushing empties the draft's cache too"


# ---- sampled requests: the target's distribution, exactly -------------------------------------

PROMPT = tokens(40, 12)
SAMPLED = dict(temperature=0.9, top_k=3, frequency_penalty=0.6)
NEW_TOKENS = 3  # two drafts and the token after them, all from the pass that ends the prompt


def exact_distribution(model_dir) -> dict[tuple[int, ...], float]:
    """P(first NEW_TOKENS tokens) of the target without speculation: HF transformers' logits,
    processed as the request's sampling parameters say (langrt's SamplingBatch)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    params = SamplingParams(max_new_tokens=NEW_TOKENS, **SAMPLED)
    out = {(): 1.0}
    for _ in range(NEW_TOKENS):
        grown = {}
        for prefix, mass in out.items():
            with torch.no_grad():
                logits = model(torch.tensor([PROMPT + list(prefix)])).logits[:, -1].float()
            sampling = SamplingBatch.from_params([params], [None], "cpu")
            sampling.apply_penalties(logits, [PROMPT], [list(prefix)])
            probs = sampling.distribution(logits)[0]
            for token in probs.nonzero().flatten().tolist():
                grown[prefix + (token,)] = mass * probs[token].item()
        out = grown
    return out


def sample_with_drafts(scheduler, n: int) -> tuple[Counter, float]:
    reqs = [
        Req(f"s{i}", list(PROMPT), SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, **SAMPLED))
        for i in range(n)
    ]
    run_requests(scheduler, reqs, stagger=False)
    stats = scheduler.stats
    return Counter(tuple(r.output_ids) for r in reqs), stats.spec_accept_rate


def chi_square_p_small(counts: Counter, exact: dict, alpha_z: float = 3.719) -> tuple[float, float]:
    """(chi-square statistic, its critical value at p = 1e-4) of `counts` against `exact`;
    a sample outside the exact support makes the statistic infinite."""
    n = sum(counts.values())
    if any(key not in exact for key in counts):
        return math.inf, 0.0
    stat = sum((counts.get(key, 0) - n * p) ** 2 / (n * p) for key, p in exact.items())
    k = len(exact) - 1  # Wilson-Hilferty: the chi-square quantile from the normal's
    return stat, k * (1 - 2 / (9 * k) + alpha_z * math.sqrt(2 / (9 * k))) ** 3


def naive_keep(p, q, drafts, generators):
    """The bug rejection sampling prevents: every draft kept as it is."""
    return drafts


def resample_from_p(p, q, drafts, generators):
    """A subtler bug: on rejection, draw from p instead of max(0, p - q)."""
    from langrt.sampling.sampler import race

    x = drafts.unsqueeze(1)
    uniforms = torch.stack([torch.rand(()) for _ in generators])
    kept = uniforms * q.gather(1, x).squeeze(1) < p.gather(1, x).squeeze(1)
    return torch.where(kept, drafts, race(p, generators))


def test_sampled_outputs_follow_the_target_distribution(tiny_llama_dir, llama_drafts, monkeypatch):
    """3,000 samples of the first three tokens with a draft model (two drafts each, judged in
    one pass): a chi-square test against the target's exact joint distribution passes (p-value
    above 1e-4); with a thousand samples it catches keeping drafts naively (tokens the target
    never samples) and drawing from p, not max(0, p - q), after a rejection (measured: ~10x the
    critical value at 2,000 samples)."""
    exact = exact_distribution(tiny_llama_dir)
    assert len(exact) == 27 and abs(sum(exact.values()) - 1) < 1e-5
    settings = dict(max_total_tokens=16384, context_length=256, max_running_requests=1024)
    scheduler = make_scheduler(tiny_llama_dir, **settings, **draft(llama_drafts["truncated"]))
    counts, accept_rate = sample_with_drafts(scheduler, 3000)
    stat, critical = chi_square_p_small(counts, exact)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}: not the target's distribution"
    assert scheduler.stats.spec_draft_tokens == 2 * 3000 and 0.1 < accept_rate < 1, "drafts were judged, some kept"
    for bug in (naive_keep, resample_from_p):
        monkeypatch.setattr(token_emitter, "rejection_sample", bug)
        scheduler = make_scheduler(tiny_llama_dir, **settings, **draft(llama_drafts["truncated"]))
        stat, critical = chi_square_p_small(sample_with_drafts(scheduler, 1000)[0], exact)
        assert stat > 3 * critical, f"{bug.__name__} went unnoticed (chi-square {stat:.1f}, critical {critical:.1f})"


# ---- the draft must be the target's tokenizer's ---------------------------------------------------


def test_a_draft_with_another_vocabulary_is_refused(tmp_path, tiny_llama_dir, tiny_model_builder, llama_drafts):
    smaller = tmp_path / "smaller_vocab"
    tiny_model_builder("llama", smaller, vocab_size=1024)
    with pytest.raises(ModelLoadError, match="vocabulary of 1024 tokens, the target 49152"):
        make_scheduler(tiny_llama_dir, **SETTINGS, **draft(smaller))
    swapped = tmp_path / "swapped_tokens"
    shutil.copytree(llama_drafts["random"], swapped)
    spec = json.loads((swapped / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = [t for t, i in vocab.items() if i in (300, 301)]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ModelLoadError, match="another tokenizer than the target: token id 300"):
        make_scheduler(tiny_llama_dir, **SETTINGS, **draft(swapped))


# ---- SmolLM2 with its own first layers as the draft ---------------------------------------------


@pytest.fixture(scope="module")
def smollm_engines(tmp_path_factory):
    # its first 24 of 30 layers: an untrained early exit agrees with the full model's argmax on
    # about a third of tokens (fewer layers, fewer: 8 layers ~5%), enough to keep some drafts
    truncated = write_truncated_model(None, tmp_path_factory.mktemp("smollm_first_layers"), 24)
    settings = dict(log_level="warning", max_total_tokens=8192, dtype="float32")
    with langrt.Engine(**settings, **draft(truncated)) as on, langrt.Engine(**settings) as off:
        yield on, off


def test_smollm_greedy_outputs_are_the_same_with_a_draft_model(smollm_engines):
    on, off = smollm_engines
    chat = [
        on.tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
        for c in ("What is the capital of France?", "Write a short poem about the sea.", "List three colors.")
    ]
    params = [{"max_new_tokens": 48, "temperature": 0}] * 2 + [
        {
            "max_new_tokens": 48,
            "temperature": 0,
            "json_schema": json.dumps(
                {
                    "type": "object",
                    "properties": {"colors": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
                    "required": ["colors"],
                }
            ),
        }
    ]
    with_drafts, without = on.generate(chat, params), off.generate(chat, params)
    assert [o["output_ids"] for o in with_drafts] == [o["output_ids"] for o in without]
    assert "Paris" in with_drafts[0]["text"]
    json.loads(with_drafts[2]["text"])
    assert sum(o["meta_info"]["spec_accepted_tokens"] for o in with_drafts) > 0
    stats = on.cache_stats()
    assert stats["spec_accept_length"] > 1.0 and 0 < stats["spec_accept_rate"] <= 1.0
