"""SamplingBatch and logprobs: statistical tests over many draws (a batch of repeated rows).

Every statistical test fixes torch's seed, so it is deterministic; its bounds are several
standard deviations wide, so it also passes for other seeds.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from langrt.sampling import (
    SamplingBatch,
    SamplingParams,
    ban_tokens,
    logprobs_of,
    make_generator,
    top_logprobs,
)

DRAWS = 20_000
# Six tokens with clear gaps, so no filter boundary sits on a rounding error.
PROBS = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
LOGITS = PROBS.log()


def batch_of(params, generators=None, device="cpu") -> SamplingBatch:
    generators = [None] * len(params) if generators is None else generators
    return SamplingBatch.from_params(params, generators, device)


def draw(logits: torch.Tensor, params: SamplingParams, n: int = DRAWS, seed: int = 0):
    """n independent draws from one row: the row repeated n times in one batch."""
    torch.manual_seed(seed)
    return batch_of([params] * n).sample(logits.expand(n, -1))


def empirical(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).double() / tokens.numel()


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * (p.double() - q.double()).abs().sum().item()


def entropy(p: torch.Tensor) -> float:
    p = p[p > 0]
    return -(p * p.log()).sum().item()


def renormalized(keep: list[int]) -> torch.Tensor:
    p = torch.zeros_like(PROBS)
    p[keep] = PROBS[keep]
    return p / p.sum()


# ---- greedy -------------------------------------------------------------------------------


def test_all_greedy_batch_is_argmax_and_uses_no_randomness():
    torch.manual_seed(0)
    logits = torch.randn(64, 1000)
    params = [SamplingParams(temperature=0), SamplingParams(top_k=1, temperature=1.5)] * 32
    state = torch.get_rng_state()
    tokens = batch_of(params).sample(logits)
    assert torch.equal(torch.get_rng_state(), state)
    assert tokens.dtype == torch.int64
    assert torch.equal(tokens, logits.argmax(-1))


def test_greedy_rows_in_a_mixed_batch_take_argmax():
    torch.manual_seed(1)
    logits = torch.randn(512, 20) * 0.1  # nearly flat: sampled rows rarely hit the argmax
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_p=0.9)] * 256
    tokens = batch_of(params).sample(logits)
    argmax = logits.argmax(-1)
    assert torch.equal(tokens[0::2], argmax[0::2])
    assert (tokens[1::2] != argmax[1::2]).float().mean() > 0.5


def test_tiny_temperature_is_argmax_without_nan():
    torch.manual_seed(2)
    logits = torch.randn(256, 500) * 30
    tokens = batch_of([SamplingParams(temperature=1e-6)] * 256).sample(logits)
    assert torch.equal(tokens, logits.argmax(-1))


# ---- filters: support and distribution ----------------------------------------------------


def test_top_k_never_samples_outside_the_k_largest():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(3))
    tokens = draw(logits, SamplingParams(top_k=5, temperature=2.0))
    assert set(tokens.tolist()) == set(logits.topk(5).indices.tolist())


def test_top_k_keeps_ties_at_the_boundary():
    logits = torch.tensor([3.0, 2.0, 2.0, 0.0, -1.0])
    tokens = draw(logits, SamplingParams(top_k=2))
    assert set(tokens.tolist()) == {0, 1, 2}


def test_top_k_larger_than_vocab_is_no_filter():
    tokens = draw(LOGITS, SamplingParams(top_k=1000))
    assert total_variation(empirical(tokens, 6), PROBS) < 0.02


@pytest.mark.parametrize(
    "top_p,nucleus",
    [(1e-6, [0]), (0.3, [0]), (0.5, [0, 1]), (0.7, [0, 1, 2]), (0.85, [0, 1, 2, 3])],
)
def test_top_p_samples_the_nucleus_with_renormalized_probs(top_p, nucleus):
    tokens = draw(LOGITS, SamplingParams(top_p=top_p))
    assert set(tokens.tolist()) == set(nucleus)
    assert total_variation(empirical(tokens, 6), renormalized(nucleus)) < 0.02


@pytest.mark.parametrize("min_p,kept", [(0.3, [0, 1, 2]), (0.2, [0, 1, 2, 3]), (0.7, [0])])
def test_min_p_never_samples_below_the_threshold(min_p, kept):
    tokens = draw(LOGITS, SamplingParams(min_p=min_p))
    assert set(tokens.tolist()) == set(kept)
    assert total_variation(empirical(tokens, 6), renormalized(kept)) < 0.02


@pytest.mark.parametrize(
    "top_k,top_p,min_p,kept",
    [
        (4, 0.8, 0.0, [0, 1, 2]),  # top-p over top-4 renormalized: .44 .72 .89 -> 3 tokens
        (2, 0.6, 0.0, [0]),  # renormalized top-2 is (.62, .38): top_p .6 is reached at once
        (4, 0.8, 0.5, [0, 1]),  # min-p .5 * .40 = .20 drops token 2
        (3, 1.0, 0.2, [0, 1, 2]),
        (-1, 0.95, 0.3, [0, 1, 2]),  # top-p keeps 0..4, min-p .3 * .40 = .12 keeps 0..2
    ],
)
def test_combined_filters(top_k, top_p, min_p, kept):
    params = SamplingParams(top_k=top_k, top_p=top_p, min_p=min_p)
    tokens = draw(LOGITS, params)
    assert set(tokens.tolist()) == set(kept)
    assert total_variation(empirical(tokens, 6), renormalized(kept)) < 0.02


def test_rows_with_different_filters_in_one_batch():
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.3), SamplingParams(min_p=0.2), SamplingParams()] * 5000
    torch.manual_seed(4)
    tokens = batch_of(params).sample(LOGITS.expand(len(params), -1))
    assert set(tokens[0::4].tolist()) == {0, 1}
    assert set(tokens[1::4].tolist()) == {0}
    assert set(tokens[2::4].tolist()) == {0, 1, 2, 3}
    assert set(tokens[3::4].tolist()) == set(range(6))


def naive_allowed(logits: torch.Tensor, p: SamplingParams, slack: float) -> set[int]:
    """Reference filter in float64, made `slack` more permissive at each boundary."""
    probs = torch.softmax(logits.double() / p.temperature, -1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if p.top_k > 0:
        kth = probs.sort(descending=True).values[min(p.top_k, len(probs)) - 1]
        keep &= probs >= kth * (1 - slack)
    renorm = torch.where(keep, probs, 0.0)
    renorm = renorm / renorm.sum()
    values = renorm.sort(descending=True).values
    before = values.cumsum(0) - values
    last = int((before < p.top_p + slack).sum()) - 1
    keep &= renorm >= values[last] * (1 - slack)
    keep &= probs >= p.min_p * probs.max() * (1 - slack)
    return set(torch.nonzero(keep).flatten().tolist())


@settings(max_examples=40, deadline=None)
@given(
    logits=st.lists(st.floats(-5, 5), min_size=2, max_size=16),
    temperature=st.floats(0.2, 3.0),
    top_k=st.one_of(st.just(-1), st.integers(1, 20)),
    top_p=st.floats(0.05, 1.0),
    min_p=st.floats(0.0, 0.9),
)
def test_samples_stay_inside_a_naive_reference_filter(logits, temperature, top_k, top_p, min_p):
    logits = torch.tensor(logits)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    tokens = draw(logits, params, n=500)
    assert set(tokens.tolist()) <= naive_allowed(logits, params, slack=1e-4)
    assert int(logits.argmax()) in naive_allowed(logits, params, slack=0.0)


# ---- unseeded and seeded distributions ----------------------------------------------------


def test_unseeded_sampling_matches_softmax():
    logits = torch.randn(8, generator=torch.Generator().manual_seed(5))
    probs = torch.softmax(logits, -1).double()
    counts = torch.bincount(draw(logits, SamplingParams(), seed=6), minlength=8).double()
    expected = probs * DRAWS
    chi_square = ((counts - expected) ** 2 / expected).sum().item()
    assert chi_square < 24.32  # 99.9% quantile of chi-square with 7 degrees of freedom
    assert total_variation(counts / DRAWS, probs) < 0.02


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_logits(temperature):
    tokens = draw(LOGITS, SamplingParams(temperature=temperature))
    expected = torch.softmax(LOGITS / temperature, -1)
    assert total_variation(empirical(tokens, 6), expected) < 0.02


def test_higher_temperature_increases_entropy():
    logits = torch.randn(30, generator=torch.Generator().manual_seed(7)) * 2
    entropies = [entropy(empirical(draw(logits, SamplingParams(temperature=t)), 30)) for t in (0.3, 0.7, 1.0, 2.0, 5.0)]
    assert entropies == sorted(entropies)
    assert entropies[-1] - entropies[0] > 1.0


def _seeded_run(seed, position, others, steps, step_logits):
    """Tokens of the seeded row at `position`, among `others` (SamplingParams, generator)."""
    rows = list(others)
    rows.insert(position, (SamplingParams(seed=seed), make_generator(seed, "cpu")))
    batch = batch_of([p for p, _ in rows], [g for _, g in rows])
    out = []
    for step in range(steps):
        noise = torch.randn(len(rows), step_logits.shape[-1])
        logits = torch.cat([noise[:position], step_logits[step : step + 1], noise[position + 1 :]])
        out.append(int(batch.sample(logits)[position]))
    return out


def test_seed_reproduces_regardless_of_batch_and_default_rng():
    step_logits = torch.randn(10, 1000, generator=torch.Generator().manual_seed(8))
    torch.manual_seed(100)
    alone = _seeded_run(42, 0, [], 10, step_logits)
    torch.manual_seed(200)
    crowded = _seeded_run(
        42,
        2,
        [
            (SamplingParams(), None),
            (SamplingParams(temperature=0), None),
            (SamplingParams(seed=7, top_k=5), make_generator(7, "cpu")),
            (SamplingParams(top_p=0.5), None),
        ],
        10,
        step_logits,
    )
    assert alone == crowded
    torch.manual_seed(100)
    assert _seeded_run(43, 0, [], 10, step_logits) != alone


def test_seeded_rows_do_not_touch_the_default_rng():
    params = [SamplingParams(seed=s) for s in range(4)]
    gens = [make_generator(s, "cpu") for s in range(4)]
    state = torch.get_rng_state()
    batch_of(params, gens).sample(torch.randn(4, 100, generator=torch.Generator()))
    assert torch.equal(torch.get_rng_state(), state)


def test_a_seeded_row_draws_exponential_noise_from_its_generator():
    """A seed's stream is exponential_'s, V numbers a step, in a batch with unseeded rows (whose
    noise is -log U): the token is argmax(p / E) for E drawn by exponential_ from a generator of
    the same seed, so a seed gives the tokens it gave before the unseeded draw changed."""
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(3))
    gens = [None, make_generator(9, "cpu"), None]
    tokens = batch_of([SamplingParams(), SamplingParams(seed=9), SamplingParams()], gens).sample(logits)
    reference = torch.empty(500).exponential_(generator=make_generator(9, "cpu"))
    assert int(tokens[1]) == int((logits[1].softmax(-1) / reference).argmax())


def test_seeded_sampling_matches_softmax():
    n = 4000
    params = [SamplingParams(seed=s) for s in range(n)]
    gens = [make_generator(s, "cpu") for s in range(n)]
    tokens = batch_of(params, gens).sample(LOGITS.expand(n, -1))
    assert total_variation(empirical(tokens, 6), PROBS) < 0.04


def test_generator_on_another_device_is_rejected():
    gen = torch.Generator(device="cpu")
    with pytest.raises(ValueError, match="make_generator"):
        SamplingBatch.from_params([SamplingParams(seed=1)], [gen], "meta")


# ---- penalties ----------------------------------------------------------------------------


def test_frequency_and_presence_penalties_exact():
    logits = torch.zeros(2, 5)
    batch = batch_of([SamplingParams(frequency_penalty=0.5), SamplingParams(presence_penalty=0.25)])
    batch.apply_penalties(logits, [[4], [4]], [[0, 0, 1], [0, 0, 1]])
    assert torch.equal(logits[0], torch.tensor([-1.0, -0.5, 0.0, 0.0, 0.0]))
    assert torch.equal(logits[1], torch.tensor([-0.25, -0.25, 0.0, 0.0, 0.0]))


def test_repetition_penalty_exact_over_prompt_and_output():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    batch = batch_of([SamplingParams(repetition_penalty=2.0)])
    batch.apply_penalties(logits, [[0, 1]], [[3, 3]])
    assert torch.equal(logits, torch.tensor([[1.0, -4.0, 2.0, -4.0, 1.0]]))


def test_penalties_combine_repetition_first():
    logits = torch.tensor([[2.0, 2.0]])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0, presence_penalty=0.5)
    batch_of([params]).apply_penalties(logits, [[]], [[0, 0]])
    assert torch.equal(logits, torch.tensor([[2.0 / 2 - 2 * 1.0 - 0.5, 2.0]]))


def _penalized_distribution(params: SamplingParams, prompt, output) -> torch.Tensor:
    logits = torch.ones(DRAWS, 4)
    batch = batch_of([params] * DRAWS)
    batch.apply_penalties(logits, [prompt] * DRAWS, [output] * DRAWS)
    torch.manual_seed(9)
    return empirical(batch.sample(logits), 4)


@pytest.mark.parametrize(
    "params,expected_logits",
    [
        (SamplingParams(frequency_penalty=0.5), [0.0, 0.5, 1.0, 1.0]),
        (SamplingParams(frequency_penalty=-0.5), [2.0, 1.5, 1.0, 1.0]),
        (SamplingParams(presence_penalty=1.0), [0.0, 0.0, 1.0, 1.0]),
        (SamplingParams(repetition_penalty=1.8), [1 / 1.8, 1 / 1.8, 1 / 1.8, 1.0]),
    ],
)
def test_penalties_shift_the_sampled_distribution(params, expected_logits):
    # output [0, 0, 1], prompt [2]; token 3 never seen
    freq = _penalized_distribution(params, [2], [0, 0, 1])
    expected = torch.softmax(torch.tensor(expected_logits), -1)
    assert total_variation(freq, expected) < 0.02
    if params.frequency_penalty < 0:
        assert freq[0] > freq[1] > freq[3] + 0.05
    else:
        assert freq[0] < freq[3] - 0.05


def test_batch_without_penalties_leaves_logits_untouched():
    logits = torch.randn(3, 10)
    before = logits.clone()
    batch = batch_of([SamplingParams(), SamplingParams(temperature=0), SamplingParams(top_k=3)])
    # returns at once: not even the (here invalid) ids are looked at
    batch.apply_penalties(logits, [[10**9]], [[-5], [], []])
    assert torch.equal(logits, before)


def test_unpenalized_rows_of_a_penalized_batch_are_untouched():
    logits = torch.randn(3, 10)
    logits[2, 4] = float("-inf")
    before = logits.clone()
    batch = batch_of([SamplingParams(), SamplingParams(frequency_penalty=1.0), SamplingParams()])
    batch.apply_penalties(logits, [[1, 2]] * 3, [[1, 4]] * 3)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert not torch.equal(logits[1], before[1])


def test_sample_does_not_modify_logits():
    logits = torch.randn(4, 50)
    before = logits.clone()
    params = [SamplingParams(temperature=0.7, top_k=5, top_p=0.8, min_p=0.05)] * 4
    batch_of(params).sample(logits)
    assert torch.equal(logits, before)


def test_banned_tokens_are_never_sampled():
    logits = LOGITS.repeat(DRAWS, 1)
    ban_tokens(logits, [[0, 2]] * DRAWS)
    torch.manual_seed(10)
    tokens = batch_of([SamplingParams()] * DRAWS).sample(logits)
    assert set(tokens.tolist()) == {1, 3, 4, 5}
    greedy = batch_of([SamplingParams(temperature=0)] * DRAWS).sample(logits)
    assert set(greedy.tolist()) == {1}


# ---- shapes and edge cases ----------------------------------------------------------------


def test_shape_mismatches_raise():
    batch = batch_of([SamplingParams()] * 2)
    with pytest.raises(ValueError, match=r"\[2, vocab\]"):
        batch.sample(torch.randn(3, 10))
    with pytest.raises(ValueError, match="generators"):
        SamplingBatch.from_params([SamplingParams()], [], "cpu")


def test_empty_batch():
    assert batch_of([]).sample(torch.empty(0, 10)).shape == (0,)


def test_half_precision_logits():
    logits = LOGITS.to(torch.bfloat16).expand(DRAWS, -1)
    torch.manual_seed(11)
    tokens = batch_of([SamplingParams(top_p=0.7)] * DRAWS).sample(logits)
    assert set(tokens.tolist()) == {0, 1, 2}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_semantics():
    tokens = batch_of([SamplingParams(top_k=3)] * DRAWS, device="cuda").sample(LOGITS.cuda().expand(DRAWS, -1))
    assert tokens.device.type == "cuda" and set(tokens.tolist()) == {0, 1, 2}
    rows = [(SamplingParams(seed=5), make_generator(5, "cuda")) for _ in range(2)]
    batch = batch_of([p for p, _ in rows], [g for _, g in rows], device="cuda")
    logits = torch.randn(1, 1000, device="cuda").expand(2, -1)
    first, second = batch.sample(logits).tolist()
    assert first == second  # same seed, same logits, independent generators


# ---- logprobs -----------------------------------------------------------------------------


def test_logprobs_of_matches_log_softmax():
    torch.manual_seed(12)
    logits = torch.randn(7, 300) * 5
    ids = torch.randint(0, 300, (7,))
    expected = torch.log_softmax(logits.double(), -1)[torch.arange(7), ids]
    got = logprobs_of(logits, ids)
    assert got.dtype == torch.float32 and got.shape == (7,)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)


def test_logprobs_in_float32_for_bf16_logits():
    logits = (torch.randn(3, 50000) * 10).to(torch.bfloat16)
    ids = logits.float().argmin(-1)
    expected = torch.log_softmax(logits.double(), -1).gather(-1, ids[:, None]).squeeze(1)
    got = logprobs_of(logits, ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, atol=1e-3, rtol=0)


def test_top_logprobs_descending_and_consistent():
    torch.manual_seed(13)
    logits = torch.randn(5, 100)
    values, ids = top_logprobs(logits, 4)
    assert values.shape == ids.shape == (5, 4)
    assert torch.all(values[:, :-1] >= values[:, 1:])
    assert torch.equal(ids[:, 0], logits.argmax(-1))
    torch.testing.assert_close(values, logprobs_of(logits.repeat_interleave(4, 0), ids.flatten()).view(5, 4))
    assert top_logprobs(logits, 0)[0].shape == (5, 0)
    assert top_logprobs(logits, 1000)[1].shape == (5, 100)
    assert math.isclose(top_logprobs(logits, 100)[0].exp().sum(-1)[0].item(), 1.0, rel_tol=1e-5)


# ---- speculative rejection sampling --------------------------------------------------------------


def test_rejection_sampling_gives_the_target_distribution_whatever_the_draft():
    """20,000 rows, each a draft drawn from q and judged against p: the kept-or-redrawn tokens
    follow p (total variation under 0.02), drafts where p >= q are always kept, and a redraw never
    returns the rejected draft."""
    from langrt.sampling.sampler import race, rejection_sample

    torch.manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    n = 20_000
    drafts = race(q.expand(n, -1).clone(), [None] * n)
    out = rejection_sample(p.expand(n, -1), q.expand(n, -1), drafts, [None] * n)
    freq = torch.bincount(out, minlength=5).float() / n
    assert (freq - p).abs().sum() / 2 < 0.02, freq
    assert freq[4] == 0, "a token the target never samples"
    kept_where_p_wins = out[drafts <= 1] == drafts[drafts <= 1]
    assert kept_where_p_wins.all()
    naive = torch.bincount(drafts, minlength=5).float() / n
    assert (naive - p).abs().sum() / 2 > 0.3, "keeping drafts as they are would follow q"


def test_rejection_sampling_is_reproducible_with_each_rows_generator():
    from langrt.sampling.sampler import rejection_sample

    p = torch.tensor([[0.2, 0.3, 0.5]] * 3)
    q = torch.tensor([[0.6, 0.3, 0.1]] * 3)
    drafts = torch.tensor([0, 0, 2])

    def once():
        return rejection_sample(p, q, drafts, [make_generator(s, "cpu") for s in (1, 2, 3)]).tolist()

    assert once() == once()


def test_distribution_is_what_sample_draws_from_and_one_hot_for_greedy_rows():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.0, 2.0]])
    params = [SamplingParams(temperature=0.5, top_k=2), SamplingParams(temperature=0.0)]
    probs = SamplingBatch.from_params(params, [None, None], "cpu").distribution(logits)
    top2 = torch.softmax(torch.tensor([2.0, 1.0]) / 0.5, dim=0)
    assert torch.allclose(probs[0], torch.tensor([top2[0], top2[1], 0.0, 0.0]))
    assert probs[1].tolist() == [0.0, 1.0, 0.0, 0.0]
