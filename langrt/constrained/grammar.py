"""The grammar engine, usable without a model (DESIGN §7).

    from langrt.constrained import GrammarCompiler, allocate_token_bitmask

    # tokenizer: a transformers tokenizer, a tokenizers.Tokenizer (with eos_token_ids=...), a
    # .gguf file or HF directory path, or a TokenVocabulary. Optional: vocab_size= (the model's
    # logits width, when wider than the tokenizer) and eos_token_ids=.
    compiler = GrammarCompiler(tokenizer)
    grammar = compiler.compile_json_schema({"type": "object", ...})   # or compile_regex / compile_choices
    matcher = grammar.matcher()
    bitmask = allocate_token_bitmask(batch, compiler.vocab_size)   # int32 [batch, ceil(V/32)]
    matcher.fill_bitmask(bitmask, row)   # tokens allowed next (EOS only where the grammar may end)
    matcher.accept_token(token_id)       # False (and no change) if the grammar forbids it
    matcher.is_terminated()              # ended: EOS accepted, or nothing may follow
    matcher.copy()                       # for forks: a matcher is a state number, nothing more

Jump-forward (see jump_forward.py): `matcher.certain_tail(n)` (the tokens the grammar alone
decides, to its end), `matcher.propose_drafts(n, encode)` (tokens likely spelling the forced
text next), `matcher.allowed_ids_along(drafts, rows)` (the allowed ids at each draft's row), and
`matcher.accept_sampled(token)` (accept_token for a model's token, learning its spelling).

`GrammarCompiler.from_tokenizer(tokenizer)` and `GrammarCompiler.from_pretrained(path)` say which
they take; `apply_token_bitmask(logits, bitmask)` applies the masks. A grammar is a byte-level
DFA (outlines-core) plus token masks computed per state on first use and shared by every matcher
of that grammar.
"""

from __future__ import annotations

import json

import os
from typing import Any, Callable, Iterable

import torch

from langrt.constrained import jump_forward
from langrt.constrained.byte_dfa import ByteAutomaton, ByteDFA, build_byte_dfa, build_rule_dfa
from langrt.constrained.cfg.build import RuleCache
from langrt.constrained.cfg.walk_cache import RuleWalks
from langrt.constrained.masks import TokenMasks
from langrt.constrained.native.token_walk import vocab_trie
from langrt.constrained.spec import check_regex, choices_regex
from langrt.constrained.vocab import TokenVocabulary, describe, vocabulary_from_pretrained, vocabulary_from_tokenizer
from langrt.errors import InvalidRequest

# Why: a DFA's states each cost a token mask (~6 KB for a 49k vocabulary, computed on first
# visit), so 200k states bound a grammar's worst case to ~1 GB.
MAX_DFA_STATES = 200_000


class Grammar:
    def __init__(self, dfa: ByteAutomaton, vocab: TokenVocabulary, source: str, walks: RuleWalks | None = None):
        """walks: rule walks shared with other grammars over `vocab` (cfg/walk_cache.py)."""
        self.dfa = dfa
        self.vocab = vocab
        self.masks = _token_masks(dfa, vocab, walks)
        self.source = source
        # how models spell forced runs, learned from their outputs (jump-forward drafts)
        self.spellings = jump_forward.LearnedSpellings(dfa)

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
        n = mask.numel()
        if bitmask.is_cpu:  # numpy's copy costs half of torch's slicing and copy_
            out = bitmask.numpy()[row]
            out[:n] = mask.numpy()
            out[n:] = 0
            return
        bitmask[row, :n].copy_(mask)
        if bitmask.shape[1] > n:
            bitmask[row, n:] = 0

    def prefetch(self, drafts: list[int]) -> None:
        """Compute (and memoize) the masks a pass computing `drafts` will read: at the current
        state and after each draft. Does not move the matcher; safe on another thread while
        the matcher is not moved (scheduler.constraints.MaskPrefetch)."""
        if not self.terminated:
            self.allowed_ids_along(drafts, len(drafts) + 1)

    def accept_token(self, token_id: int) -> bool:
        if self.terminated:
            return False
        g = self.grammar
        if token_id in g.vocab.eos_token_ids:
            if g.dfa.accepts(self.state):
                self.terminated = True
                return True
            return False
        data = g.vocab.token_bytes[token_id] if token_id < len(g.vocab.token_bytes) else None
        return bool(data) and self.accept_bytes(data)

    def accept_sampled(self, token_id: int) -> bool:
        """accept_token for a token a model sampled: also learned as the grammar's spelling
        from the state before it (where that lies in forced text), for later drafts."""
        before = self.state
        if not self.accept_token(token_id):
            return False
        self.grammar.spellings.note(before, token_id)
        return True

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
        return self.grammar.dfa.accepts(self.state)

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

    def certain_tail(self, max_tokens: int) -> list[int]:
        """The tokens the grammar alone decides from here to its end (one allowed at each
        step), at most `max_tokens`; [] if some step has a choice. See jump_forward.py."""
        return jump_forward.certain_tail(self, max_tokens)

    def propose_drafts(self, max_tokens: int, encode: Callable[[str], list[int]]) -> list[int]:
        """Up to `max_tokens` tokens likely spelling the text the grammar forces next, as
        models spelled it before (else as `encode` does), to be verified against the model's
        own samples. See jump_forward.py."""
        return jump_forward.propose_drafts(self, max_tokens, encode)

    def allowed_ids_along(self, drafts: list[int], n_rows: int) -> list[torch.Tensor | None]:
        """Per row i < n_rows: the ids allowed after drafts[:i] (None where too many to list).
        See jump_forward.py."""
        return jump_forward.allowed_ids_along(self, drafts, n_rows)


class GrammarCompiler:
    """Compiles grammars over one vocabulary.

    `tokenizer` is what a user has: a transformers tokenizer (fast or slow), a
    `tokenizers.Tokenizer`, a model path (a .gguf file or an HF directory, str or os.PathLike),
    or a `TokenVocabulary` already built (as the runtime does). With a tokenizer or a path:
      vocab_size: the model's logits width, when it exceeds the tokenizer's length (a path
        defaults to its model's, where the config is there);
      eos_token_ids: the ids that end the output (default: the tokenizer's EOS, and with a path
        the model config's too; a `tokenizers.Tokenizer` names none, so it needs them given).
    """

    def __init__(
        self,
        tokenizer: Any,
        max_states: int = MAX_DFA_STATES,
        *,
        vocab_size: int | None = None,
        eos_token_ids: int | Iterable[int] | None = None,
    ):
        if isinstance(tokenizer, TokenVocabulary):
            if vocab_size is not None or eos_token_ids is not None:
                raise TypeError(
                    "a TokenVocabulary already fixes vocab_size and eos_token_ids; pass them when building it, "
                    "or pass the tokenizer instead"
                )
            vocab = tokenizer
        elif isinstance(tokenizer, (str, os.PathLike)):
            vocab = vocabulary_from_pretrained(tokenizer, vocab_size, eos_token_ids)
        else:
            vocab = vocabulary_from_tokenizer(tokenizer, vocab_size, eos_token_ids)
        self.vocab = vocab
        self.max_states = max_states
        self._rules = RuleCache()
        self._walks = RuleWalks()  # the masks of rules this compiler's grammars share
        vocab_trie(vocab)  # built now (~0.1 s), not inside the first request's first mask

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        eos_token_ids: int | Iterable[int] | None = None,
        max_states: int = MAX_DFA_STATES,
    ) -> "GrammarCompiler":
        """From a transformers tokenizer or a `tokenizers.Tokenizer` object."""
        if isinstance(tokenizer, (str, os.PathLike, TokenVocabulary)):
            raise TypeError(
                f"from_tokenizer takes a tokenizer object, got {describe(tokenizer)}; use from_pretrained "
                "for a path, GrammarCompiler(vocabulary) for a TokenVocabulary"
            )
        return cls(vocabulary_from_tokenizer(tokenizer, vocab_size, eos_token_ids), max_states)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        vocab_size: int | None = None,
        eos_token_ids: int | Iterable[int] | None = None,
        max_states: int = MAX_DFA_STATES,
    ) -> "GrammarCompiler":
        """From a model on disk: a .gguf file, or an HF directory with a tokenizer (local files
        only; langrt never downloads)."""
        return cls(vocabulary_from_pretrained(path, vocab_size, eos_token_ids), max_states)

    @property
    def vocab_size(self) -> int:
        """Width of the logits the masks cover (the bitmask needs ceil(vocab_size / 32) words)."""
        return self.vocab.vocab_size

    def compile_regex(self, regex: str) -> Grammar:
        check_regex(regex)
        return self._regex_grammar(regex)

    def _regex_grammar(self, regex: str) -> Grammar:
        """A regex already checked, or written by langrt (no second parse by Python's re: for a
        schema's regex that parse cost a fifth of the compile)."""
        try:
            dfa = build_byte_dfa(regex, self.max_states)
        except ValueError as e:
            raise InvalidRequest(f"regex not supported: {e}", param="regex") from None
        return Grammar(dfa, self.vocab, regex)

    def compile_json_schema(
        self, schema: Any, whitespace: str = "compact", open_objects: bool = False, any_order: bool = False
    ) -> Grammar:
        """open_objects: properties a schema does not list may appear where it does not say
        additionalProperties; any_order: properties in any order, not only the schema's
        (json_schema.schema_to_grammar)."""
        from langrt.constrained.json_schema import schema_to_grammar

        source = schema_to_grammar(schema, whitespace=whitespace, open_objects=open_objects, any_order=any_order)
        if isinstance(source, str):
            return self._regex_grammar(source)
        return self._grammar(source, json.dumps(schema) if not isinstance(schema, str) else schema, "json_schema")

    def compile_choices(self, choices: list[str]) -> Grammar:
        return self.compile_regex(choices_regex(choices))

    def compile_ebnf(self, ebnf: str) -> Grammar:
        """A GBNF/EBNF grammar starting at `root` (see cfg/ebnf.py for the syntax)."""
        from langrt.constrained.cfg.build import ebnf_rules

        return self._grammar(ebnf_rules(ebnf), ebnf, "ebnf")

    def compile_structural_tag(self, structures: list[dict], triggers: list[str], **options) -> Grammar:
        """SGLang's structural tag: free text whose tagged regions ({begin, schema, end}, each
        begin starting with a trigger) hold JSON valid against their schema; options free_text,
        separator, max_tags (structural_tag.py)."""
        from langrt.constrained.json_schema import schema_to_grammar
        from langrt.constrained.structural_tag import canonical, structural_tag_grammar

        text = canonical({"structures": structures, "triggers": triggers, **options})
        source = structural_tag_grammar(text, schema_to_grammar)
        if isinstance(source, str):
            return self._regex_grammar(source)
        return self._grammar(source, text, "structural_tag")

    def compile_rules(self, rules: dict, start: str = "root") -> Grammar:
        """A grammar given as trees (cfg/ast.py nodes by rule name), starting at `start`."""
        from langrt.constrained.cfg.rules import compile_rules

        def fail(pos: int, message: str):
            raise InvalidRequest(message, param="grammar")

        return self._grammar(compile_rules(rules, start, fail), repr(rules), "grammar")

    def _grammar(self, rules, source: str, param: str) -> Grammar:
        from langrt.constrained.cfg.build import build_automaton

        try:
            pda = build_automaton(
                rules, self._rules.wrap(lambda body: build_rule_dfa(body, self.max_states)), self.max_states
            )
        except ValueError as e:
            raise InvalidRequest(f"{param} not supported: {e}", param=param) from None
        return Grammar(pda, self.vocab, source, self._walks)


def _token_masks(dfa: ByteAutomaton, vocab: TokenVocabulary, walks: RuleWalks | None):
    if isinstance(dfa, ByteDFA):
        return TokenMasks(dfa, vocab)
    from langrt.constrained.cfg.masks import PushdownMasks

    return PushdownMasks(dfa, vocab, walks)
