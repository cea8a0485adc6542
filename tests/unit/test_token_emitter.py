"""TokenEmitter on its own: real Reqs, a real StopChecker, real grammars over the built-in
tokenizer; only the runner is fake (and, where said, the draft source).

The fake runner is a lookup: hidden row r is the vector [r], and its logits are `model(context)`
for the tokens row r was "computed" with (the request's tokens so far, then the drafts before
the row), as the scheduler lays a pass out (`Scheduler._process`). A model here is any function
of the context: scripted by output position, or a seeded draw per context (like a real model,
its rows after a wrong draft differ).
"""

from __future__ import annotations

import re
import zlib

import pytest
import torch

from langrt.messages import RequestOptions
from langrt.sampling.sampler import SamplingBatch, make_generator
from langrt.sampling.sampling_params import SamplingParams
from langrt.request import FinishReason, Req, ReqStatus, StopChecker
from langrt.scheduler.scheduler import SchedulerStats
from langrt.scheduler.token_emitter import Emission, TokenEmitter
from langrt.tokenizer.text_decoder import load_text_decoder

V = 49152  # the built-in model's logits width
EOS = 2
PROMPT = [1, 4093, 28, 2683]
BANG = 17  # "!": forbidden by every grammar below
LANGUAGES = r'\{"languages": ?\["[A-Z][a-z]+"\]\}'  # forced text first, then free text
CLOSING = r"[0-9]\}\n\}"  # after the digit the rest is certain: `}`, `\n`, `}` one token each
SCRIPT = [101, 102, 103, 104, 105]


@pytest.fixture(scope="module")
def decoder(smollm_path):
    decoder = load_text_decoder(smollm_path)
    assert decoder.eos_token_id == EOS and decoder.encode("!") == [BANG]
    return decoder


# ---- the fake runner and its models ---------------------------------------------------------


def logits_with(values: dict[int, float]) -> torch.Tensor:
    row = torch.zeros(V)
    for token, value in values.items():
        row[token] = value
    return row


class ByPosition:
    """Output position p (counted from the prompt's end) favours script[p], whatever the tokens;
    scripts per request, by the prompt's first token."""

    def __init__(self, scripts: dict[int, list[int]] | list[int]):
        self.scripts = scripts if isinstance(scripts, dict) else {PROMPT[0]: scripts}

    def __call__(self, context: list[int]) -> torch.Tensor:
        return logits_with({self.scripts[context[0]][len(context) - len(PROMPT)]: 5.0})


class Hashed:
    """A seeded draw per context, like a model's logits; `levels`: quantized to that many values
    (ties), `favour`: logits set whatever the context."""

    def __init__(self, levels: int | None = None, favour: dict[int, float] | None = None):
        self.levels, self.favour = levels, favour or {}

    def __call__(self, context: list[int]) -> torch.Tensor:
        g = torch.Generator().manual_seed(zlib.crc32(repr(list(context)).encode()))
        row = (
            torch.randn(V, generator=g)
            if self.levels is None
            else torch.randint(0, self.levels, (V,), generator=g).float()
        )
        for token, value in self.favour.items():
            row[token] = value
        return row


class Constant:
    def __init__(self, favour: dict[int, float]):
        self.row = logits_with(favour)

    def __call__(self, context):
        return self.row


class FakeRunner:
    """What emit calls on a runner, over a table: hidden row r is [r], its logits table[r]."""

    def __init__(self, table: torch.Tensor):
        self.table = table
        self.full_rows: list[int] = []  # rows whose full logits were asked for
        self.single: list[tuple[int, int]] = []  # (row, token) logits asked for alone
        self.emissions: list[Emission] = []

    @property
    def hidden(self) -> torch.Tensor:
        return torch.arange(len(self.table), dtype=torch.float32).unsqueeze(1)

    @property
    def vocab_size(self) -> int:
        return self.table.shape[1]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden[:, 0].long()
        self.full_rows += rows.tolist()
        return self.table[rows].clone()

    def compute_logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        rows, token_ids = hidden[rows, 0].long(), token_ids.long()
        self.single += list(zip(rows.tolist(), token_ids.tolist()))
        return self.table[rows, token_ids].clone()


class ScriptedDrafts:
    """A DraftSource that is not the grammar: drafts from a function of the request."""

    def __init__(self, guess):
        self.guess, self.asked = guess, 0

    def drafts(self, req: Req) -> list[int]:
        self.asked += 1
        return list(self.guess(req))


def make_req(prompt=PROMPT, matcher=None, return_logprob=False, seed=None, **params) -> Req:
    params.setdefault("temperature", 0.0)
    params.setdefault("max_new_tokens", 16)
    req = Req(
        f"r{prompt[0]}",
        list(prompt),
        SamplingParams(seed=seed, **params),
        RequestOptions(return_logprob=return_logprob),
    )
    req.status = ReqStatus.RUNNING
    req.matcher = matcher
    if seed is not None:
        req.generator = make_generator(seed, "cpu")
    return req


def make_emitter(decoder, jump_forward: bool = True, draft_source=None) -> TokenEmitter:
    return TokenEmitter(StopChecker({EOS}, context_len=4096), decoder, jump_forward, SchedulerStats(), draft_source)


def forward(emitter: TokenEmitter, reqs: list[Req], model) -> FakeRunner:
    """One pass as the scheduler runs it: each unfinished request's last token and its drafts
    computed, their rows handed to emit (the drafts leave req.draft_ids)."""
    contexts, emissions = [], []
    for req in reqs:
        if req.finished:
            continue
        drafts, req.draft_ids = req.draft_ids, []
        start = len(contexts)
        contexts += [req.all_ids + drafts[:i] for i in range(len(drafts) + 1)]
        emissions.append(Emission(req, list(range(start, len(contexts))), drafts))
    runner = FakeRunner(torch.stack([model(c) for c in contexts]))
    runner.emissions = emissions
    emitter.emit(emissions, runner.hidden, runner)
    return runner


def generate(emitter: TokenEmitter, reqs: list[Req], model, max_passes: int = 100) -> list[FakeRunner]:
    """From the prompt to the end: drafts proposed after the prompt and after each pass, as the
    scheduler does. Returns one runner per pass."""
    for req in reqs:
        emitter.propose(req)
    passes = []
    while not all(r.finished for r in reqs):
        assert len(passes) < max_passes
        passes.append(forward(emitter, reqs, model))
        for req in reqs:
            emitter.propose(req)
    return passes


def spelled(vocab, tokens) -> bytes:
    return b"".join(vocab.token_bytes[t] for t in tokens)


def masked_argmax(matcher, row: torch.Tensor) -> int:
    """The argmax of a full logits row with the matcher's forbidden tokens at -inf."""
    bits = torch.zeros((1, (V + 31) // 32), dtype=torch.int32)
    matcher.fill_bitmask(bits, 0)
    allowed = ((bits[0].unsqueeze(-1) >> torch.arange(32)) & 1).flatten()[:V].bool()
    return int(row.masked_fill(~allowed, float("-inf")).argmax())


# ---- 1. draft verification, whatever the drafts' source -------------------------------------


@pytest.mark.parametrize(
    "drafts, output, kept",
    [
        ([101, 102, 103], [101, 102, 103, 104], 3),  # all kept: one token more than the drafts
        ([999, 102, 103], [101], 0),  # the first rejected: row 0's token alone
        ([101, 999, 103], [101, 102], 1),  # the middle one: row 2 (whose token is draft 2) unread
        ([], [101], 0),
    ],
    ids=["all-accepted", "first-rejected", "middle-rejected", "none"],
)
def test_rows_are_read_in_order_until_the_first_mismatch(decoder, drafts, output, kept):
    source = ScriptedDrafts(lambda req: drafts)
    emitter = make_emitter(decoder, draft_source=source)
    req = make_req()
    emitter.propose(req)
    assert req.draft_ids == drafts and source.asked == 1
    forward(emitter, [req], ByPosition(SCRIPT))
    assert req.output_ids == output and not req.finished
    assert emitter.stats.jump_forward_tokens == kept
    plain, plain_emitter = make_req(), make_emitter(decoder, jump_forward=False)
    for _ in output:  # without drafts: one token a pass
        forward(plain_emitter, [plain], ByPosition(SCRIPT))
    assert plain.output_ids == output


def test_requests_in_one_pass_each_read_their_own_rows(decoder):
    drafts = {10: [101, 102], 20: [201, 999, 203], 30: []}
    emitter = make_emitter(decoder, draft_source=ScriptedDrafts(lambda req: drafts[req.input_ids[0]]))
    reqs = [make_req(prompt=[p] + PROMPT[1:]) for p in drafts]
    for req in reqs:
        emitter.propose(req)
    scripts = {10: [101, 102, 103, 104], 20: [201, 202, 203, 204], 30: [301, 302]}
    forward(emitter, reqs, ByPosition(scripts))
    assert [r.output_ids for r in reqs] == [[101, 102, 103], [201, 202], [301]]
    assert emitter.stats.jump_forward_tokens == 3


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, seed=7)], ids=["greedy", "seeded"])
def test_drafts_save_passes_and_change_no_output(decoder, sampling):
    """Drafts guessed from a reference run (every fourth one wrong) on a model whose rows
    depend on their whole context: the output is the reference's, in fewer passes."""
    model = Hashed()
    reference = make_req(max_new_tokens=24, **sampling)
    plain = generate(make_emitter(decoder, jump_forward=False), [reference], model)
    assert len(plain) == len(reference.output_ids) > 10

    def guess(req):
        n = len(req.output_ids)
        ahead = reference.output_ids[n : n + min(5, req.remaining_new_tokens - 1)]
        return [t + 1 if (n + j) % 4 == 3 else t for j, t in enumerate(ahead)]

    emitter = make_emitter(decoder, draft_source=ScriptedDrafts(guess))
    req = make_req(max_new_tokens=24, **sampling)
    passes = generate(emitter, [req], model)
    assert req.output_ids == reference.output_ids
    assert req.finish_reason == reference.finish_reason
    kept = emitter.stats.jump_forward_tokens
    assert len(passes) + kept == len(req.output_ids) and len(passes) < len(plain)
    assert sum(len(e.drafts) for p in passes for e in p.emissions) > kept > 0, "some drafts rejected"


# ---- 2. stops among accepted drafts ---------------------------------------------------------


@pytest.mark.parametrize(
    "params, script, output, reason",
    [
        (dict(stop_token_ids=(102,)), SCRIPT, [101, 102], FinishReason.by_stop(102)),
        ({}, [101, EOS, 103, 104], [101, EOS], FinishReason.by_stop(EOS)),
        # a source may guess past the budget (2 drafts allowed here): emit stops at it anyway
        (dict(max_new_tokens=3), SCRIPT, [101, 102, 103], FinishReason.by_length(3)),
        (dict(max_new_tokens=2), SCRIPT, [101, 102], FinishReason.by_length(2)),
    ],
    ids=["stop-token", "eos", "max-new-tokens-at-last-row", "max-new-tokens-mid-drafts"],
)
def test_a_stop_among_accepted_drafts_ends_the_request_there(decoder, params, script, output, reason):
    drafts = script[:3]  # each equal to its row's token: all would be kept
    emitter = make_emitter(decoder, draft_source=ScriptedDrafts(lambda req: drafts))
    req = make_req(**params)
    emitter.propose(req)
    forward(emitter, [req], ByPosition(script))
    assert req.output_ids == output
    assert req.finished and req.finish_reason == reason
    assert emitter.stats.jump_forward_tokens == len(output) - 1
    emitter.propose(req)
    assert req.draft_ids == [] and req.output_ids == output


# ---- 3. grammar masking ---------------------------------------------------------------------


def test_a_constrained_row_never_gives_a_forbidden_token(decoder, compiler, vocab):
    """Full rows (no drafts): the forbidden `!` has by far the highest logit."""
    grammar = compiler.compile_regex(r"[ab]{1,3}")
    b = decoder.encode("b")[0]
    emitter = make_emitter(decoder)
    greedy = make_req(matcher=grammar.matcher())
    sampled = [
        make_req(prompt=[100 + s] + PROMPT[1:], matcher=grammar.matcher(), temperature=1.0, seed=s) for s in range(20)
    ]
    forward(emitter, [greedy] + sampled, Constant({BANG: 20.0, b: 3.0}))
    assert greedy.output_ids == [b]
    for req in sampled:
        assert len(req.output_ids) == 1 and re.fullmatch(rb"[ab]{1,3}", spelled(vocab, req.output_ids))


@pytest.mark.parametrize("jump_forward", [True, False])
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, seed=3)], ids=["greedy", "seeded"])
def test_constrained_output_follows_its_grammar(decoder, compiler, vocab, jump_forward, sampling):
    req = make_req(matcher=compiler.compile_regex(LANGUAGES).matcher(), max_new_tokens=20, **sampling)
    generate(make_emitter(decoder, jump_forward), [req], Hashed(favour={BANG: 20.0}))
    assert BANG not in req.output_ids
    walker = compiler.compile_regex(LANGUAGES).matcher()
    assert all(walker.accept_token(t) for t in req.output_ids if t != EOS)
    assert spelled(vocab, req.output_ids).startswith(b'{"languages":')


def test_greedy_among_allowed_takes_the_lowest_id_on_ties(decoder, compiler):
    """Row 0 of the grammar's drafts allows `{` and `{"`, tied; `!` is higher but forbidden."""
    grammar = compiler.compile_regex(LANGUAGES)
    emitter = make_emitter(decoder)
    req = make_req(matcher=grammar.matcher())
    emitter.propose(req)
    brace, brace_quote = decoder.encode("{")[0], decoder.encode('{"')[0]
    assert req.draft_ids[0] == brace_quote > brace
    row = logits_with({BANG: 10.0, brace: 3.0, brace_quote: 3.0})
    expected = masked_argmax(grammar.matcher(), row)
    runner = forward(emitter, [req], Constant({BANG: 10.0, brace: 3.0, brace_quote: 3.0}))
    assert req.output_ids == [expected] == [brace], 'the draft `{"` lost the tie: the run ends'
    assert sorted(t for r, t in runner.single if r == 0) == [brace, brace_quote] and 0 not in runner.full_rows


def test_greedy_draft_rows_choose_as_the_masked_full_row(decoder, compiler, vocab):
    """At every draft row the draft is the best allowed token (`!` better, forbidden): all are
    kept, each row answered from its allowed tokens' logits alone, the last from its full row."""
    grammar = compiler.compile_regex(LANGUAGES)
    emitter = make_emitter(decoder)
    req = make_req(matcher=grammar.matcher())
    emitter.propose(req)
    drafts = list(req.draft_ids)
    allowed = grammar.matcher().allowed_ids_along(drafts, len(drafts) + 1)
    assert allowed[-1] is None and all(len(ids) > 1 for ids in allowed[:-1])
    capital = decoder.encode("F")[0]
    rows = []
    for i, ids in enumerate(allowed[:-1]):
        rows.append(logits_with({BANG: 10.0, **{t: 1.0 for t in ids.tolist()}, drafts[i]: 3.0}))
    rows.append(logits_with({BANG: 10.0, capital: 2.0}))
    runner = FakeRunner(torch.stack(rows))
    emitter.emit([Emission(req, list(range(len(rows))), drafts)], runner.hidden, runner)
    walker, expected = grammar.matcher(), []
    for row in rows:
        expected.append(masked_argmax(walker, row))
        assert walker.accept_token(expected[-1])
    assert req.output_ids == expected == drafts + [capital]
    assert runner.full_rows == [len(drafts)]
    assert sorted(runner.single) == sorted((i, t) for i, ids in enumerate(allowed[:-1]) for t in ids.tolist())
    assert emitter.stats.jump_forward_tokens == len(drafts)


def test_greedy_drafts_give_the_output_of_full_rows(decoder, compiler):
    """Logits of three values (ties everywhere): drafting and not drafting give the output of
    masked full rows' argmaxes, token by token (both read the rows inside forced text from their
    allowed tokens' logits alone)."""
    model = Hashed(levels=3, favour={BANG: 10.0})
    walker, expected = compiler.compile_regex(LANGUAGES).matcher(), []
    while len(expected) < 24 and not walker.is_terminated():
        expected.append(masked_argmax(walker, model(PROMPT + expected)))
        assert walker.accept_token(expected[-1])
    outputs, runs = {}, {}
    for jump_forward in (True, False):
        req = make_req(matcher=compiler.compile_regex(LANGUAGES).matcher(), max_new_tokens=24)
        runs[jump_forward] = generate(make_emitter(decoder, jump_forward), [req], model)
        outputs[jump_forward] = req.output_ids
    assert outputs[True] == outputs[False] == expected
    assert any(r.single for r in runs[True]) and any(r.single for r in runs[False])
    assert len(runs[True]) < len(runs[False])


def test_rows_without_drafts_read_only_their_allowed_tokens(decoder, compiler, vocab):
    """No jump-forward: a row inside forced text reads its allowed tokens' logits alone, greedy
    (as the masked full row would choose: the forbidden `!` is highest) or sampled; a row of many
    choices and a request that wants logprobs read full rows."""
    emitter = make_emitter(decoder, jump_forward=False)
    forced = make_req(matcher=compiler.compile_regex(LANGUAGES).matcher())
    free = make_req(prompt=[200] + PROMPT[1:], matcher=compiler.compile_regex(r"[a-z]+").matcher())
    sampled = make_req(
        prompt=[201] + PROMPT[1:], matcher=compiler.compile_regex(LANGUAGES).matcher(), temperature=1.0, seed=0
    )
    logprobs = make_req(
        prompt=[202] + PROMPT[1:], matcher=compiler.compile_regex(LANGUAGES).matcher(), return_logprob=True
    )
    model = Hashed(favour={BANG: 20.0})
    runner = forward(emitter, [forced, free, sampled, logprobs], model)
    allowed = compiler.compile_regex(LANGUAGES).matcher().allowed_ids_along([], 1)[0]
    assert allowed is not None and 1 < len(allowed) <= 8
    assert sorted(runner.single) == [(row, t) for row in (0, 2) for t in allowed.tolist()]
    assert runner.full_rows == [1, 3]
    assert forced.output_ids == [masked_argmax(compiler.compile_regex(LANGUAGES).matcher(), model(PROMPT))]
    assert spelled(vocab, forced.output_ids + sampled.output_ids + logprobs.output_ids).count(b"{") == 3
    assert re.fullmatch(rb"[a-z]+", spelled(vocab, free.output_ids))


@pytest.mark.parametrize("jump_forward", [True, False])
def test_sampled_rows_draw_as_from_the_masked_full_rows(decoder, compiler, jump_forward):
    """A seeded sampled request: its rows of few allowed tokens are built from those tokens'
    logits alone, and it draws the tokens that sampling each masked full row with the same
    generator draws, token for token (the same noise, V numbers a row)."""
    model = Hashed(favour={BANG: 20.0})
    params = dict(temperature=1.0, top_p=0.9, seed=7, max_new_tokens=14)
    walker, generator, expected = compiler.compile_regex(LANGUAGES).matcher(), make_generator(7, "cpu"), []
    while len(expected) < 14 and not walker.is_terminated():
        bits = torch.zeros((1, (V + 31) // 32), dtype=torch.int32)
        walker.fill_bitmask(bits, 0)
        allowed = ((bits[0].unsqueeze(-1) >> torch.arange(32)) & 1).flatten()[:V].bool()
        row = model(PROMPT + expected).masked_fill(~allowed, float("-inf")).unsqueeze(0)
        batch = SamplingBatch.from_params(
            [SamplingParams(**{k: v for k, v in params.items() if k != "seed"})], [generator], "cpu"
        )
        expected.append(int(batch.sample(row)[0]))
        assert walker.accept_token(expected[-1])
    req = make_req(matcher=compiler.compile_regex(LANGUAGES).matcher(), **params)
    runs = generate(make_emitter(decoder, jump_forward), [req], model)
    assert req.output_ids == expected
    assert any(r.single for r in runs)


# ---- 4. certain tails -----------------------------------------------------------------------


@pytest.mark.parametrize("jump_forward", [True, False])
def test_a_certain_tail_is_output_at_once_and_ends_the_request(decoder, compiler, jump_forward):
    seven, tail = decoder.encode("7")[0], [decoder.encode(c)[0] for c in "}\n}"]
    model = Constant({BANG: 20.0, seven: 5.0})
    emitter = make_emitter(decoder, jump_forward)
    req = make_req(matcher=compiler.compile_regex(CLOSING).matcher())
    emitter.propose(req)
    assert req.output_ids == [] and req.draft_ids == [], "a digit to choose first"
    forward(emitter, [req], model)
    emitter.propose(req)
    if jump_forward:
        assert req.output_ids == [seven] + tail and req.finished, "no pass for the tail"
        assert req.finish_reason == FinishReason.by_stop(EOS)
        assert emitter.stats.certain_tail_tokens == 3
    else:
        assert req.output_ids == [seven] and req.draft_ids == [] and not req.finished
        assert len(generate(emitter, [req], model)) == 3 and req.output_ids == [seven] + tail


@pytest.mark.parametrize("stop", ["max_new_tokens", "stop_token"])
def test_a_certain_tail_ends_at_a_stop(decoder, compiler, stop):
    """Cut at the budget, or at a stop token inside it: nothing after (nor drafts)."""
    brace, newline = decoder.encode("}")[0], decoder.encode("\n")[0]
    params = dict(max_new_tokens=3) if stop == "max_new_tokens" else dict(stop_token_ids=(newline,))
    emitter = make_emitter(decoder, draft_source=ScriptedDrafts(lambda req: [brace]))
    req = make_req(matcher=compiler.compile_regex(CLOSING).matcher(), **params)
    forward(emitter, [req], Constant({decoder.encode("7")[0]: 5.0}))
    emitter.propose(req)
    assert req.output_ids[1:] == [brace, newline] and req.draft_ids == []
    reason = FinishReason.by_length(3) if stop == "max_new_tokens" else FinishReason.by_stop(newline)
    assert req.finish_reason == reason and emitter.stats.certain_tail_tokens == 2


def test_no_certain_tail_when_the_request_wants_logprobs(decoder, compiler):
    """Its tail's tokens need their logits: drafted and computed instead, with the same output."""
    model = Constant({BANG: 20.0, decoder.encode("7")[0]: 5.0})
    plain = make_req(matcher=compiler.compile_regex(CLOSING).matcher())
    generate(make_emitter(decoder), [plain], model)
    emitter = make_emitter(decoder)
    req = make_req(matcher=compiler.compile_regex(CLOSING).matcher(), return_logprob=True)
    forward(emitter, [req], model)
    emitter.propose(req)
    assert len(req.output_ids) == 1 and not req.finished and req.draft_ids == plain.output_ids[1:]
    forward(emitter, [req], model)
    assert req.finished and req.output_ids == plain.output_ids
    assert emitter.stats.certain_tail_tokens == 0 and emitter.stats.jump_forward_tokens == 2
    assert req.output_logprobs.token_ids == req.output_ids
    assert all(v is not None and v <= 0.0 for v in req.output_logprobs.values)


# ---- 5. no drafts without jump-forward ------------------------------------------------------


def test_no_drafts_without_jump_forward(decoder, compiler):
    forced = make_req(matcher=compiler.compile_regex(LANGUAGES).matcher())
    make_emitter(decoder).propose(forced)
    assert spelled(compiler.vocab, forced.draft_ids) == b'{"languages": ["', "with it: the forced text"

    emitter = make_emitter(decoder, jump_forward=False)
    assert emitter.draft_source is None
    req = make_req(matcher=compiler.compile_regex(LANGUAGES).matcher(), max_new_tokens=12)
    passes = generate(emitter, [req], Hashed(favour={BANG: 20.0}))
    assert all(e.drafts == [] for p in passes for e in p.emissions) and len(passes) == len(req.output_ids) == 12
    assert emitter.stats.jump_forward_tokens == 0

    source = ScriptedDrafts(lambda req: [101, 102])
    emitter = make_emitter(decoder, jump_forward=False, draft_source=source)
    req = make_req()
    emitter.propose(req)
    assert req.draft_ids == [] and source.asked == 0, "off means off, whatever the source"


# ---- any guess is safe ------------------------------------------------------------------------------


@pytest.mark.parametrize("guess", [[BANG, 81], [EOS]], ids=["forbidden-text", "eos"])
def test_any_guess_is_safe_for_a_greedy_constrained_request(decoder, compiler, guess):
    """A greedy constrained request's draft rows are resolved up front (allowed_ids_along): a
    draft its grammar forbids, or one without bytes (EOS), is rejected like any wrong guess
    (was ValueError from an empty allowed list, TypeError from walking None)."""
    grammar = compiler.compile_regex(r"[ab]{0,3}")  # may end at once: EOS is allowed at row 0
    a = decoder.encode("a")[0]
    emitter = make_emitter(decoder, draft_source=ScriptedDrafts(lambda req: guess))
    req = make_req(matcher=grammar.matcher())
    emitter.propose(req)
    forward(emitter, [req], Constant({a: 5.0}))
    assert req.output_ids == [a] and not req.finished


@pytest.mark.parametrize("guess", [[BANG, 81], [EOS]], ids=["forbidden-text", "eos"])
def test_any_guess_is_safe_for_a_sampled_constrained_request(decoder, compiler, guess):
    grammar = compiler.compile_regex(r"[ab]{0,3}")
    a = decoder.encode("a")[0]
    emitter = make_emitter(decoder, draft_source=ScriptedDrafts(lambda req: guess))
    req = make_req(matcher=grammar.matcher(), temperature=1.0, seed=0)
    emitter.propose(req)
    forward(emitter, [req], Constant({a: 30.0}))
    assert req.output_ids == [a] and not req.finished
