"""N-gram drafts (prompt lookup): where the last few tokens of a request occurred before, in its
own prompt and output or (where they never did) in recent outputs, the tokens that followed them
then are its drafts: all of them on the passage being copied, only those every occurrence agrees
on for a fresh match of a repeated n-gram, and round and round where the match runs into the
request's last token (a loop).

This pays where outputs copy their input (extraction, quoting, editing a document, code) and
costs nothing where no n-gram matches. Where matches mislead, the request's draft length backs
off (DraftLength), since every draft row costs compute (on a CPU, nearly as much as its token).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field

from langrt.request import Req

# Why 4 down to 2: a longer match predicts better, so the longest is tried first; one token
# (" the") matches almost anywhere and predicts little, so matches need two at least.
MAX_NGRAM = 4
MIN_NGRAM = 2
# Why 200,000: n-grams of recent outputs kept for other requests, ~3 per output token (one per
# n), so the outputs of the last ~60,000 tokens; an entry costs ~300 bytes, ~60 MB in all.
RECENT_NGRAMS = 200_000
# Why 2: on a CPU a pass with draft rows costs ~2.3x a one-row decode pass at 2-5 rows and
# ~2.8x at 9 (SmolLM2, bf16, 2 cores: the rows go to a GEMM instead of a matrix-vector product),
# so a verification pays only when it keeps two drafts or more (three tokens for ~2.5 passes).
PAYING_ACCEPTED = 2
# Why 64: a request whose drafts did not pay pauses drafting for 2, 4, 8... passes, up to 64,
# so that text copying nothing soon costs a few percent at most.
MAX_PAUSE = 64
# Why 4: drafts that were all kept were copying a passage, which usually goes on; growing
# fourfold (4, 16) reaches a long draft in one pass fewer than doubling. Replayed on
# bench_speculative's extraction outputs (16 requests), with the other choices here, it cuts the
# decode passes' cost by ~9% against doubling; where drafts rarely match it changes nothing.
GROWTH = 4


@dataclass
class DraftLength:
    """A request's draft length, adapted to how its drafts fare: all kept, it grows fourfold
    (up to `maximum`); some rejected, it becomes the kept count plus one (at least `least`). A
    verification that kept fewer than `least` pauses drafting, twice as long as the pause
    before; one that paid shortens the next pause."""

    maximum: int
    length: int = 0
    pause: int = 0
    misses: int = 0  # pauses so far, less those paid back

    def __post_init__(self):
        assert self.maximum >= 1
        self.length = self.length or min(4, self.maximum)

    def take(self) -> int:
        """Drafts this pass may have (0 while pausing)."""
        if self.pause:
            self.pause -= 1
            return 0
        return self.length

    @property
    def least(self) -> int:
        """Fewer drafts than this are not worth a pass's extra rows."""
        return min(PAYING_ACCEPTED, self.maximum)

    def update(self, proposed: int, accepted: int) -> None:
        if accepted >= proposed:
            self.length = min(self.maximum, max(self.length, proposed) * GROWTH)
        else:
            self.length = max(self.least, min(self.maximum, accepted + 1))
        if accepted >= self.least:
            self.misses = max(0, self.misses - 1)
            return
        self.misses += 1
        self.pause = min(MAX_PAUSE, 2**self.misses)


class RecentOutputs:
    """N-grams of recent outputs (any request's) -> where they occurred: the token list and the
    position after them, least recently written dropped first. Shared by the requests of one
    scheduler (its thread alone uses it)."""

    def __init__(self, capacity: int = RECENT_NGRAMS):
        self.capacity = capacity
        self._after: OrderedDict[tuple[int, ...], tuple[list[int], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._after)

    def clear(self) -> None:
        self._after.clear()

    def add(self, key: tuple[int, ...], ids: list[int], after: int) -> None:
        self._after[key] = (ids, after)
        self._after.move_to_end(key)
        if len(self._after) > self.capacity:
            self._after.popitem(last=False)

    def follows(self, key: tuple[int, ...], n: int) -> list[int]:
        found = self._after.get(key)
        if found is None:
            return []
        ids, after = found
        return ids[after : after + n]


@dataclass
class _RequestNgrams:
    """One request's tokens so far, and its n-grams -> the positions after their occurrences
    (only those with a token after them: the request's own last n-gram is never its match).

    A document often repeats an n-gram ("was founded in" in each paragraph): of its occurrences
    the one chosen is the first after `cursor`, where the previous drafts were copied from, so a
    copy goes on through the same passage; the latest occurrence where none is after it."""

    length: DraftLength
    ids: list[int] = field(default_factory=list)
    after: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    cursor: int = 0

    def catch_up(self, all_ids: list[int], prompt_len: int, recent: RecentOutputs | None) -> None:
        start = len(self.ids)
        self.ids += all_ids[start:]
        ids = self.ids
        for p in range(max(start, 1), len(ids)):  # positions that now have a token after them
            for n in range(MIN_NGRAM, min(MAX_NGRAM, p) + 1):
                key = tuple(ids[p - n : p])
                self.after.setdefault(key, []).append(p)
                if recent is not None and p > prompt_len:
                    recent.add(key, ids, p)

    def follows(self, key: tuple[int, ...], n: int) -> list[int] | None:
        """Up to n tokens after an occurrence of `key` (None where it has none): the one just
        after `cursor` continues the passage being copied; a fresh match of a key seen more than
        once drafts only what follows every occurrence (a paragraph's opening `The` matches each
        paragraph, and guessing one wastes a pass)."""
        places = self.after.get(key)
        if places is None:
            return None
        i = bisect.bisect_left(places, self.cursor)
        start = places[i] if i < len(places) else places[-1]
        if len(places) > 1 and not (i < len(places) and start <= self.cursor + 1):
            n = self._agreed(places, start, n)
        self.cursor = start + n
        return self._copy(start, n)

    def _agreed(self, places: list[int], start: int, n: int) -> int:
        """How many of the n tokens from `start` follow every occurrence in `places` too."""
        ids = self.ids
        agreed = 0
        while agreed < n and start + agreed < len(ids):
            token = ids[start + agreed]
            if any(p + agreed >= len(ids) or ids[p + agreed] != token for p in places):
                break
            agreed += 1
        return agreed

    def _copy(self, start: int, n: int) -> list[int]:
        """n tokens from `start`; past the end of the request's tokens the copy repeats itself
        (a request that loops over a phrase goes on looping: its drafts are the loop)."""
        copied = self.ids[start : start + n]
        period = len(self.ids) - start
        while len(copied) < n:
            copied.append(copied[len(copied) - period])
        return copied


class NgramDrafts:
    """--speculative-algorithm NGRAM: up to `max_drafts` tokens that followed the longest recent
    match of the request's last MAX_NGRAM..MIN_NGRAM tokens, in its own tokens first, then in
    recent outputs; cut where its grammar (if any) forbids a token, so drafts stay allowed."""

    name = "ngram"

    def __init__(self, max_drafts: int, recent: RecentOutputs | None = None):
        assert max_drafts >= 1
        self.max_drafts = max_drafts
        self.recent = recent

    def drafts(self, req: Req) -> list[int]:
        state = req.draft_state.get(self.name)
        if state is None:
            state = req.draft_state[self.name] = _RequestNgrams(DraftLength(self.max_drafts))
        state.catch_up(req.all_ids, req.prompt_len, self.recent)
        n = min(state.length.take(), req.remaining_new_tokens - 1)
        if n < state.length.least:
            return []
        keys = [tuple(state.ids[-size:]) for size in range(min(MAX_NGRAM, len(state.ids)), MIN_NGRAM - 1, -1)]
        # The request's own tokens first, at any length of match: its document predicts its
        # output better than other requests' outputs do, even where theirs match longer.
        guess = None
        for key in keys:
            if (guess := state.follows(key, n)) is not None:
                break
        if guess is None and self.recent is not None:
            for key in keys:
                if guess := self.recent.follows(key, n):
                    break
        guess = allowed_prefix(req, guess or [])
        return guess if len(guess) >= state.length.least else []

    def verified(self, req: Req, proposed: int, accepted: int) -> None:
        state = req.draft_state.get(self.name)
        if state is not None:
            state.length.update(proposed, accepted)

    def flush(self) -> bool:
        """Forget every earlier output (the prefix cache was emptied): after a flush, a request's
        drafts come from its own tokens alone, as on a fresh server. Per-request n-grams live on
        the requests (Req.draft_state), and a flush happens only when none is running."""
        if self.recent is not None:
            self.recent.clear()
        return True


def allowed_prefix(req: Req, drafts: list[int]) -> list[int]:
    """The drafts up to the first one the request's grammar forbids after those before it."""
    if req.matcher is None:
        return drafts
    walker = req.matcher.copy()
    for i, token in enumerate(drafts):
        if not walker.accept_token(token):
            return drafts[:i]
    return drafts
