"""Jump-forward: what a grammar says about the tokens to come, before the model computes them.

Three questions a grammar matcher answers here (its methods of the same names call these):

- `certain_tail`: is the rest of the output certain? From the matcher's state to the grammar's
  end, one allowed token at each step (`"}` closing an object, say): the tokens any sampler
  must pick there, whatever the logits.
- `propose_drafts`: which tokens likely spell the text the grammar forces next? Drafts, to be
  computed in one forward pass with the last sampled token and kept only where the model's own
  sample equals them (the verification is the caller's: see scheduler/token_emitter.py).
- `allowed_ids_along`: the tokens allowed at each draft's row (the state after the drafts
  before it), so that a greedy pick there needs only those tokens' logits.

Drafts follow the spellings models actually wrote (`LearnedSpellings`, fed by
`GrammarMatcher.accept_sampled`), since models often split forced text differently from the
tokenizer. Nothing here knows about requests: callers pass budgets and an `encode` function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

    from langrt.constrained.byte_dfa import ByteDFA
    from langrt.constrained.grammar import GrammarMatcher

# Why 64: in forced text a model writes one of a few spellings; past 64 different tokens from
# one state the state is not worth drafting from, and the table stays small.
MAX_TOKENS_NOTED = 64


class LearnedSpellings:
    """How models spell a grammar's forced runs: state inside forced text -> {token: times a
    model wrote it from there}, shared by every matcher of the grammar (the scheduler thread
    alone reads and writes it)."""

    def __init__(self, dfa: ByteDFA):
        self._dfa = dfa
        self._seen: dict[int, dict[int, int]] = {}

    def note(self, state: int, token: int) -> None:
        """A model wrote `token` from `state`: remembered where `state` lies inside forced (or
        likely) text, the only places jump-forward drafts from."""
        seen = self._seen.get(state)
        if seen is None:
            if not self._dfa.in_run(state):
                return
            seen = self._seen[state] = {}
        if token in seen or len(seen) < MAX_TOKENS_NOTED:
            seen[token] = seen.get(token, 0) + 1

    def most_common(self, state: int) -> int | None:
        """The token models wrote most often from `state` (the first noted on ties); None if
        none was noted there."""
        seen = self._seen.get(state)
        if not seen:
            return None
        return max(seen, key=seen.__getitem__)

    def __len__(self) -> int:
        """The number of states with a spelling noted."""
        return len(self._seen)


def certain_tail(matcher: GrammarMatcher, max_tokens: int) -> list[int]:
    """The rest of the output where the grammar leaves no choice: from the matcher's state to
    the grammar's end, one allowed token at each step (the token any sampler must pick there,
    whatever the logits), cut at `max_tokens`. [] if some step allows more than one token. The
    matcher itself does not move (a copy walks)."""
    masks = matcher.grammar.masks
    matcher, tokens = matcher.copy(), []
    while len(tokens) < max_tokens and not matcher.is_terminated():
        allowed = masks.allowed_ids(matcher.state)
        if allowed is None or allowed.numel() != 1:
            return []
        tokens.append(int(allowed[0]))
        matcher.accept_token(tokens[-1])
    return tokens  # to the grammar's end, or to max_tokens (the caller's output ends by length)


def propose_drafts(matcher: GrammarMatcher, max_tokens: int, encode: Callable[[str], list[int]]) -> list[int]:
    """Where the grammar forces the next characters, tokens spelling them, at most `max_tokens`
    (`encode`: the tokenizer's text -> ids, no special tokens). The run goes on through JSON's
    optional spaces, guessed from the output's own style (`GrammarMatcher.likely_bytes`).

    Meant as drafts: the next forward pass computes them together with the last sampled token
    (or the prompt's last, for the output's opening text), and each is kept only if the token
    sampled at its position equals it, so the output is exactly what it would be without them,
    in fewer passes.

    The tokens: from each state, the token models wrote most often from there (in any request,
    see LearnedSpellings), else the tokenizer's own spelling of the rest of the run. Models
    often split text differently from the tokenizer (`language` + `s`, or ` ["` across the
    forced `[` and the free `"`), and from one request to the next (`em` + `ployed`, `employ` +
    `e` + `d`); every draft after a wrong one is computed in vain. Where models most often leave
    the run early (a token running on into free text, like ` false` after the forced space),
    drafting stops: the token sampled at the last draft's row comes from the model anyway."""
    run = matcher.likely_bytes()
    if not run or max_tokens <= 0:
        return []
    grammar = matcher.grammar
    token_bytes = grammar.vocab.token_bytes
    state, tokens, pos = matcher.state, [], 0
    while pos < len(run) and len(tokens) < max_tokens:
        token = grammar.spellings.most_common(state)
        if token is None:
            tokens += _tokenizer_spelling(run[pos:], encode, token_bytes)
            break
        data = token_bytes[token] if token < len(token_bytes) else None
        if not data or not run.startswith(data, pos):
            break
        tokens.append(token)
        pos += len(data)
        state = grammar.dfa.walk_noting_space(state, data)[0]
    return tokens[:max_tokens]


def allowed_ids_along(matcher: GrammarMatcher, drafts: list[int], n_rows: int) -> list[torch.Tensor | None]:
    """Per row 0 .. n_rows - 1 of a pass computing `drafts` after the matcher's state: the ids
    allowed there (row i: the state after drafts 0 .. i - 1), ascending; None where more than
    masks.MAX_LISTED_IDS are. The matcher itself does not move.

    Drafts are guesses: past one the grammar forbids (or one with no bytes, like EOS) the rows
    are None. The token chosen at that draft's row is an allowed one, so it never equals the
    draft, and the rows after it are never read."""
    grammar, state, allowed = matcher.grammar, matcher.state, []
    token_bytes, dead = grammar.vocab.token_bytes, grammar.dfa.dead
    for i in range(n_rows):
        allowed.append(None if state == dead else grammar.masks.allowed_ids(state))
        if i < len(drafts) and state != dead:
            data = token_bytes[drafts[i]] if drafts[i] < len(token_bytes) else None
            state = grammar.dfa.walk_noting_space(state, data)[0] if data else dead
    return allowed


def _tokenizer_spelling(run: bytes, encode: Callable[[str], list[int]], token_bytes) -> list[int]:
    """The tokenizer's tokens for the whole characters of `run` ([] if they would not spell
    those bytes back exactly)."""
    run = _whole_characters(run)
    if not run:
        return []
    tokens = encode(run.decode("utf-8"))
    if b"".join(token_bytes[t] or b"" if t < len(token_bytes) else b"" for t in tokens) != run:
        return []
    return tokens


def _whole_characters(data: bytes) -> bytes:
    """The longest prefix of `data` that ends on a character boundary."""
    for end in range(len(data), max(len(data) - 4, 0), -1):
        try:
            data[:end].decode("utf-8")
            return data[:end]
        except UnicodeDecodeError:
            continue
    return b""
