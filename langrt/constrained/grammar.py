"""The grammar engine, usable without a model (DESIGN §7).

    compiler = GrammarCompiler(vocabulary)
    grammar = compiler.compile_json_schema({"type": "object", ...})   # or compile_regex / compile_choices
    matcher = grammar.matcher()
    matcher.fill_bitmask(bitmask, row)   # tokens allowed next (EOS only where the grammar may end)
    matcher.accept_token(token_id)       # False (and no change) if the grammar forbids it
    matcher.is_terminated()              # ended: EOS accepted, or nothing may follow
    matcher.copy()                       # for forks: a matcher is a state number, nothing more

A grammar is a byte-level DFA (outlines-core) plus token masks computed per state on first use
and shared by every matcher of that grammar.
"""

from __future__ import annotations

from typing import Any

import torch

from langrt.constrained.byte_dfa import ByteDFA, build_byte_dfa
from langrt.constrained.masks import TokenMasks
from langrt.constrained.spec import check_regex, choices_regex
from langrt.constrained.vocab import TokenVocabulary
from langrt.errors import InvalidRequest

# Why: a DFA's states each cost a token mask (~6 KB for a 49k vocabulary, computed on first
# visit), so 200k states bound a grammar's worst case to ~1 GB.
MAX_DFA_STATES = 200_000
# Why 64: in forced text a model writes one of a few spellings; past 64 different tokens from
# one state the state is not worth drafting from, and the table stays small.
MAX_TOKENS_NOTED = 64


class Grammar:
    def __init__(self, dfa: ByteDFA, vocab: TokenVocabulary, source: str):
        self.dfa = dfa
        self.vocab = vocab
        self.masks = TokenMasks(dfa, vocab)
        self.source = source
        # state inside forced text -> {token: times a model wrote it from there}: how models
        # spell forced runs (jump-forward drafts; the scheduler thread alone reads and writes it)
        self.next_tokens: dict[int, dict[int, int]] = {}

    def note_next(self, state: int, token: int) -> None:
        """A model wrote `token` from `state`: remembered where `state` lies inside forced (or
        likely) text, the only places jump-forward drafts from."""
        seen = self.next_tokens.get(state)
        if seen is None:
            if not self.dfa.in_run(state):
                return
            seen = self.next_tokens[state] = {}
        if token in seen or len(seen) < MAX_TOKENS_NOTED:
            seen[token] = seen.get(token, 0) + 1

    def matcher(self) -> "GrammarMatcher":
        return GrammarMatcher(self, self.dfa.initial)


class GrammarMatcher:
    def __init__(self, grammar: Grammar, state: int, terminated: bool = False, spaced: bool = True):
        self.grammar = grammar
        self.state = state
        self.terminated = terminated
        # At the last "space or not" choice (JSON's optional space after ':' and ','), was a
        # space taken? Models keep one style within an output; before any, guess json.dumps's.
        self.spaced = spaced

    def copy(self) -> "GrammarMatcher":
        return GrammarMatcher(self.grammar, self.state, self.terminated, self.spaced)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-token bits of the current state into bitmask[row] (int32 words)."""
        mask = self.grammar.masks.packed(self.state)
        bitmask[row, : mask.numel()].copy_(mask)
        if bitmask.shape[1] > mask.numel():
            bitmask[row, mask.numel() :] = 0

    def accept_token(self, token_id: int) -> bool:
        if self.terminated:
            return False
        g = self.grammar
        if token_id in g.vocab.eos_token_ids:
            if g.dfa.accepting[self.state]:
                self.terminated = True
                return True
            return False
        data = g.vocab.token_bytes[token_id] if token_id < len(g.vocab.token_bytes) else None
        return bool(data) and self.accept_bytes(data)

    def accept_bytes(self, data: bytes) -> bool:
        """Walk `data`; False (and no change) if the grammar forbids it."""
        state, spaced = self.grammar.dfa.walk_noting_space(self.state, data)
        if state == self.grammar.dfa.dead:
            return False
        self.state = state
        if spaced is not None:
            self.spaced = spaced
        return True

    @property
    def can_end(self) -> bool:
        return bool(self.grammar.dfa.accepting[self.state])

    def is_terminated(self) -> bool:
        """EOS was accepted, or the grammar is complete and admits nothing more."""
        return self.terminated or (self.can_end and not self.grammar.dfa.has_exit(self.state))

    def forced_bytes(self) -> bytes:
        """What every continuation must start with."""
        return self.grammar.dfa.forced_bytes(self.state)

    def likely_bytes(self) -> bytes:
        """The forced bytes, continued through space choices the way this output last chose
        (jump-forward drafts: a wrong guess costs only the drafts after it)."""
        return self.grammar.dfa.forced_bytes(self.state, space=self.spaced)


class GrammarCompiler:
    def __init__(self, vocab: TokenVocabulary, max_states: int = MAX_DFA_STATES):
        self.vocab = vocab
        self.max_states = max_states

    def compile_regex(self, regex: str) -> Grammar:
        check_regex(regex)
        try:
            dfa = build_byte_dfa(regex, self.max_states)
        except ValueError as e:
            raise InvalidRequest(f"regex not supported: {e}", param="regex") from None
        return Grammar(dfa, self.vocab, regex)

    def compile_json_schema(self, schema: Any, whitespace: str = "compact") -> Grammar:
        from langrt.constrained.json_schema import schema_to_regex

        return self.compile_regex(schema_to_regex(schema, whitespace=whitespace))

    def compile_choices(self, choices: list[str]) -> Grammar:
        return self.compile_regex(choices_regex(choices))
