"""Draft sources on their own (langrt/speculative/): the n-gram source's matches, its grammar
cut and recent-output cache, the adaptive draft length, and the Drafter's choice of source and
its figures. Real Reqs; no model (the verification is tests/unit/test_token_emitter.py's, the
whole path tests/e2e/test_speculative.py's)."""

from __future__ import annotations

import pytest

from langrt.sampling.sampling_params import SamplingParams
from langrt.request import Req, ReqStatus
from langrt.speculative import Drafter, NgramDrafts, RecentOutputs
from langrt.speculative.ngram import MAX_PAUSE, PAYING_ACCEPTED, DraftLength

#          0   1   2   3   4   5   6   7   8   9  10  11
PROMPT = [500, 11, 12, 13, 14, 15, 16, 17, 600, 21, 22, 23]


def make_req(prompt=PROMPT, output=(), max_new_tokens=32, matcher=None, rid="r") -> Req:
    req = Req(rid, list(prompt), SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
    req.status = ReqStatus.RUNNING
    req.output_ids = list(output)
    req.matcher = matcher
    return req


class Fixed:
    """A draft source that always proposes the same tokens."""

    def __init__(self, tokens, name="fixed"):
        self.tokens, self.name, self.told = list(tokens), name, []

    def drafts(self, req):
        return list(self.tokens)

    def verified(self, req, proposed, accepted):
        self.told.append((proposed, accepted))

    def flush(self):
        self.told.append("flush")
        return True


# ---- n-gram matches ---------------------------------------------------------------------------


def test_the_tokens_after_an_earlier_occurrence_are_the_drafts():
    source = NgramDrafts(max_drafts=4)
    req = make_req(output=[12, 13])  # ... 12 13 occurred at positions 2-3: 14 15 16 17 followed
    assert source.drafts(req) == [14, 15, 16, 17]


def test_a_fresh_match_of_a_repeated_ngram_drafts_only_what_its_occurrences_agree_on():
    """`11 12` occurs twice with different continuations: matched afresh, it drafts nothing;
    `20 21` occurs twice and both go on with 22 23, then part."""
    prompt = [500, 11, 12, 30, 31, 32, 33, 600, 11, 12, 40, 41, 42, 43, 44, 45, 601]
    assert NgramDrafts(max_drafts=4).drafts(make_req(prompt=prompt, output=[11, 12])) == []
    assert NgramDrafts(max_drafts=4).drafts(make_req(prompt=prompt, output=[600, 11, 12], rid="s")) == [40, 41, 42, 43]
    prompt = [500, 20, 21, 22, 23, 30, 31, 600, 20, 21, 22, 23, 40, 41, 601]
    assert NgramDrafts(max_drafts=4).drafts(make_req(prompt=prompt, output=[20, 21], rid="t")) == [22, 23]


def test_on_the_passage_being_copied_a_repeated_ngram_goes_on_with_that_passage():
    """`11 12 13 14` occurs twice: once the drafts come from the second passage and are kept,
    the next match is the occurrence right after them, so the copy goes on there (40), where a
    fresh match would draft only 15, too few."""
    prompt = [500, 11, 12, 13, 14, 15, 30, 600, 11, 12, 13, 14, 15, 40, 601]
    source = NgramDrafts(max_drafts=2)
    req = make_req(prompt=prompt, output=[600, 11])
    assert source.drafts(req) == [12, 13]
    req.output_ids += [12, 13, 14]  # both kept, and the token after them is the passage's too
    source.verified(req, 2, 2)
    assert source.drafts(req) == [15, 40]
    assert NgramDrafts(max_drafts=2).drafts(make_req(prompt=prompt, output=[600, 11, 12, 13, 14], rid="s")) == []


def test_the_longest_match_wins():
    # `13` alone follows 12 at position 3 and at position 10; the 3-gram 22 12 13 only at 10
    prompt = [500, 11, 12, 13, 14, 15, 16, 17, 600, 22, 12, 13, 40, 41, 42, 43, 44]
    source = NgramDrafts(max_drafts=4)
    assert source.drafts(make_req(prompt=prompt, output=[22, 12, 13])) == [40, 41, 42, 43]
    assert source.drafts(make_req(prompt=prompt, output=[99, 11, 12, 13], rid="s")) == [14, 15, 16, 17]


def test_no_match_no_drafts_and_never_the_request_itself():
    source = NgramDrafts(max_drafts=4)
    assert source.drafts(make_req(output=[77, 78])) == []
    assert source.drafts(make_req(prompt=[5, 6, 7, 8], rid="s")) == [], "its own last n-gram has nothing after it"


def test_drafts_leave_room_for_the_token_sampled_after_them_and_are_never_one_alone():
    source = NgramDrafts(max_drafts=8)
    assert source.drafts(make_req(output=[12, 13], max_new_tokens=5)) == [14, 15]
    assert source.drafts(make_req(output=[12, 13], max_new_tokens=4, rid="s")) == [], "one draft does not pay its row"
    assert NgramDrafts(max_drafts=1).drafts(make_req(output=[12, 13], rid="u")) == [14], (
        "unless one is the most asked for"
    )


def test_a_copy_that_reaches_the_last_token_repeats_the_loop_it_is_in():
    """A match close to the end has fewer tokens after it than asked for: the text from the
    match on is a loop (a model repeating itself), and the drafts go round it."""
    assert NgramDrafts(max_drafts=4).drafts(make_req(prompt=[500, 7, 7, 7])) == [7, 7, 7, 7]
    loop = make_req(prompt=[500, 7, 8, 9, 7, 8], max_new_tokens=9, rid="s")  # 7 8 -> 9 7 8 9 ...
    assert NgramDrafts(max_drafts=4).drafts(loop) == [9, 7, 8, 9]


def test_the_index_follows_the_output_as_it_grows():
    source = NgramDrafts(max_drafts=3)
    req = make_req(output=[31, 32, 33, 34, 35])
    assert source.drafts(req) == []
    req.output_ids += [31, 32]  # 31 32 -> 33 34 35, seen in its own output
    assert source.drafts(req) == [33, 34, 35]
    assert len(req.draft_state["ngram"].ids) == req.seq_len


def test_recent_outputs_serve_other_requests():
    recent = RecentOutputs()
    source = NgramDrafts(max_drafts=4, recent=recent)
    first = make_req(prompt=[1, 2, 3], output=[70, 71, 72, 73, 74, 75, 76], rid="a")
    assert source.drafts(first) == []
    assert len(recent) > 0
    other = make_req(prompt=[9, 8, 7, 70, 71], rid="b")  # 70 71 is in a's output only
    assert source.drafts(other) == [72, 73, 74, 75]
    assert NgramDrafts(max_drafts=4).drafts(make_req(prompt=[9, 8, 7, 70, 71], rid="c")) == [], "without the cache"


def test_the_request_s_own_tokens_go_before_recent_outputs_even_where_those_match_longer():
    source = NgramDrafts(max_drafts=4, recent=RecentOutputs())
    source.drafts(make_req(prompt=[1, 2, 3], output=[70, 71, 72, 73, 74, 75, 76], rid="a"))
    other = make_req(prompt=[9, 72, 73, 90, 91, 92, 93, 600, 70, 71, 72, 73], rid="b")  # a's 4-gram; its own 2-gram
    assert source.drafts(other) == [90, 91, 92, 93]
    assert NgramDrafts(max_drafts=4, recent=source.recent).drafts(make_req(prompt=[8, 70, 71, 72, 73], rid="c")) == [
        74,
        75,
        76,
    ], "no match of its own"


def test_a_flush_empties_the_drafts_of_recent_outputs():
    """After flush_cache a request drafts as on a fresh server: another request's earlier output
    is no longer copied (benchmarks repeating a prompt measured that copy, not speculation)."""
    source = NgramDrafts(max_drafts=4, recent=RecentOutputs())
    source.drafts(make_req(prompt=[1, 2, 3], output=[70, 71, 72, 73, 74, 75, 76], rid="a"))
    assert source.drafts(make_req(prompt=[9, 8, 7, 70, 71], rid="b")) == [72, 73, 74, 75], "before the flush"
    drafter = Drafter(None, [source])
    drafter.flush()
    assert len(source.recent) == 0
    assert source.drafts(make_req(prompt=[9, 8, 7, 70, 71], rid="c")) == []
    assert source.drafts(make_req(output=[12, 13], rid="d")) == [14, 15, 16, 17], "its own tokens still draft"


def test_the_drafter_flushes_every_speculative_source():
    first, second = Fixed([7]), Fixed([8])
    Drafter(Fixed([5], "grammar"), [first, second]).flush()
    assert first.told == ["flush"] and second.told == ["flush"]


def test_recent_outputs_drop_the_least_recently_written():
    recent = RecentOutputs(capacity=3)
    ids = [1, 2, 3, 4, 5, 6]
    for p in range(2, 6):
        recent.add(tuple(ids[p - 2 : p]), ids, p)
    assert len(recent) == 3
    assert recent.follows((1, 2), 2) == [] and recent.follows((4, 5), 2) == [6]


def test_drafts_stop_where_the_grammar_forbids(tokenizer, compiler):
    digits = [tokenizer.encode(d)[0] for d in "0123"]
    letter = tokenizer.encode("x")[0]
    prompt = [500, digits[0], digits[1], digits[2], letter, digits[3], 600, digits[0], digits[1]]
    grammar = compiler.compile_regex(r"[0-9]{1,8}")
    matcher = grammar.matcher()
    for t in (digits[0], digits[1]):
        assert matcher.accept_token(t)
    req = make_req(prompt=prompt[:-2], output=[digits[0], digits[1]], matcher=matcher)
    assert NgramDrafts(max_drafts=4).drafts(req) == [], "the letter is not allowed: one digit left, too few"
    unconstrained = make_req(prompt=prompt[:-2], output=[digits[0], digits[1]], rid="s")
    assert NgramDrafts(max_drafts=4).drafts(unconstrained) == [digits[2], letter, digits[3], 600]
    prompt = [500, digits[0], digits[1], digits[2], digits[3], letter, 600]
    matcher = grammar.matcher()
    for t in (digits[0], digits[1]):
        assert matcher.accept_token(t)
    req = make_req(prompt=prompt, output=[digits[0], digits[1]], matcher=matcher, rid="t")
    assert NgramDrafts(max_drafts=4).drafts(req) == [digits[2], digits[3]]


# ---- the adaptive draft length ------------------------------------------------------------------


def test_the_length_grows_fourfold_while_all_drafts_are_kept_and_shrinks_to_what_was_kept():
    length = DraftLength(maximum=32)
    assert length.take() == 4
    length.update(4, 4)
    assert length.take() == 16
    length.update(16, 16)
    assert length.take() == 32, "capped at the maximum"
    length = DraftLength(maximum=16)
    length.update(4, 4)
    assert length.take() == 16
    length.update(16, 5)
    assert length.take() == 6
    length.update(6, 2)
    assert length.take() == 3
    length.update(3, 0)
    assert length.pause > 0 and length.length == PAYING_ACCEPTED, "never below what can pay"


def paused_passes(length: DraftLength) -> int:
    paused = 0
    while length.take() == 0:
        paused += 1
    return paused


def test_drafts_that_do_not_pay_pause_drafting_longer_each_time():
    length = DraftLength(maximum=8)
    pauses = []
    for _ in range(9):
        length.update(4, PAYING_ACCEPTED - 1)  # kept one: a pass's worth of rows for one token
        pauses.append(paused_passes(length))
    assert pauses[:6] == [2, 4, 8, 16, 32, 64] and pauses[-1] == MAX_PAUSE
    length.update(4, PAYING_ACCEPTED)
    length.update(4, 0)
    assert paused_passes(length) == MAX_PAUSE, "one that paid shortens the next pause"
    for _ in range(12):
        length.update(4, 4)
    length.update(4, 0)
    assert paused_passes(length) == 2, "a run that pays brings the pauses back to the first"


def test_a_paused_request_drafts_nothing():
    source = NgramDrafts(max_drafts=4)
    req = make_req(output=[12, 13])
    assert source.drafts(req) == [14, 15, 16, 17]
    source.verified(req, 4, 0)
    assert source.drafts(req) == [] and source.drafts(req) == [], "two passes paused"
    assert source.drafts(req) == [14, 15], "then drafts again, as many as can pay"


# ---- the Drafter: which source, and the figures -------------------------------------------------


def test_the_grammar_goes_first_then_the_speculative_sources_in_order():
    grammar, empty, ngram, other = Fixed([5, 6], "grammar"), Fixed([], "empty"), Fixed([7]), Fixed([8])
    drafter = Drafter(grammar, [empty, ngram, other])
    req = make_req()
    drafter.propose(req)
    assert req.draft_ids == [5, 6] and req.draft_source is grammar
    drafter = Drafter(Fixed([], "grammar"), [empty, ngram, other])
    drafter.propose(req)
    assert req.draft_ids == [7] and req.draft_source is ngram
    drafter = Drafter(None, [])
    drafter.propose(req)
    assert req.draft_ids == [] and req.draft_source is None


def test_verification_is_told_to_the_source_and_counted_as_speculative_only_for_guesses():
    grammar, ngram = Fixed([5, 6], "grammar"), Fixed([7, 8, 9])
    drafter = Drafter(grammar, [ngram])
    req = make_req()
    req.spec_accepted_tokens = 0
    drafter.propose(req)
    assert not drafter.verified(req, 2, 2), "jump-forward's drafts are not speculative"
    assert drafter.counts.verifications == 0 and req.spec_accepted_tokens == 0
    drafter.grammar = None
    drafter.propose(req)
    assert drafter.verified(req, 3, 1) and ngram.told == [(3, 1)]
    drafter.propose(req)
    assert drafter.verified(req, 3, 3)
    assert req.spec_accepted_tokens == 4 and req.draft_source is None
    c = drafter.counts
    assert (c.verifications, c.drafted, c.accepted) == (2, 6, 4)
    assert c.acceptance_rate == pytest.approx(4 / 6) and c.accept_length == pytest.approx(3.0)
    assert not drafter.verified(req, 0, 0), "nothing proposed: nothing to tell"


# ---- the flags ----------------------------------------------------------------------------------


def test_the_flags_take_ngram_and_draft_and_refuse_what_is_not_there():
    from langrt.cli import build_parser, server_args_from
    from langrt.server_args import ServerArgs

    ns = build_parser().parse_args(
        ["launch", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]
    )
    args = server_args_from(ns)
    assert (args.speculative_algorithm, args.speculative_num_draft_tokens) == ("NGRAM", 5)
    assert ServerArgs().speculative_algorithm is None
    # the default length: 16 n-gram drafts (a copy's passes are cheap), 8 from a draft model (each a step of it)
    assert ServerArgs(speculative_algorithm="NGRAM").speculative_num_draft_tokens == 16
    assert (
        ServerArgs(speculative_algorithm="DRAFT", speculative_draft_model_path="/d").speculative_num_draft_tokens == 8
    )
    ns = build_parser().parse_args(
        ["launch", "--speculative-algorithm", "DRAFT", "--speculative-draft-model-path", "/d"]
    )
    assert (server_args_from(ns).speculative_algorithm, server_args_from(ns).speculative_draft_model_path) == (
        "DRAFT",
        "/d",
    )
    with pytest.raises(ValueError, match="DRAFT needs --speculative-draft-model-path"):
        ServerArgs(speculative_algorithm="DRAFT")
    with pytest.raises(ValueError, match="--speculative-draft-model-path needs --speculative-algorithm DRAFT"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_draft_model_path="/d")
    with pytest.raises(ValueError, match="EAGLE.*not implemented"):
        ServerArgs(speculative_algorithm="EAGLE")
    with pytest.raises(ValueError, match="--speculative-num-draft-tokens must be positive"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_num_draft_tokens=0)
