"""Token masks of a pushdown automaton's configurations (pda.py), memoized per configuration.

A token allowed in a configuration begins in the top rule of one of its stacks (the
configuration holds every stack calls and returns reach). From a top (rule r, state s) it either

- stays inside r to its last byte: r's own DFA decides it, with the per-state masks of a regex
  (masks.TokenMasks over r's DFA, computed once per (r, s) and shared by every stack whose top
  it is), or
- reaches, after at least one byte, a state of r that calls a rule or where r may end, and
  goes on beyond r: a *candidate*, walked byte by byte through the automaton itself.

Candidates are the tokens that, after at least one byte, reach a byte that may leave r at a
boundary state (FIRST of the rule called there, FOLLOW of r where it may end: lookahead.py),
less the inner mask. The C++ trie walk (native/token_walk.py) finds both sets in one pass over
r's own DFA; without it, numpy walks r's DFA and a second one with every such byte leading on to
a state that takes any byte. Grammars keep rule ends
at delimiters (a closing quote, a bracket), so candidates are few; and a configuration's mask is
memoized whole, so most steps are a lookup.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import torch

from langrt.constrained.byte_dfa import ByteDFA
from langrt.constrained.cfg.lookahead import Lookahead
from langrt.constrained.cfg.pda import PushdownAutomaton
from langrt.constrained.masks import TokenMasks, _ranges, listed_ids, set_bit
from langrt.constrained.cfg.walk_cache import RuleWalks
from langrt.constrained.per_vocab import PerVocabCache
from langrt.constrained.native.token_walk import EscapeBits, WalkTable, common_prefix, vocab_trie
from langrt.constrained.vocab import TokenVocabulary

# Why 4,096: a configuration's mask is ~6 KB for a 49k vocabulary; 4k of them bound a grammar's
# masks to ~25 MB (recursive grammars have unboundedly many configurations).
MAX_MASKS = 4_096


class PushdownMasks:
    def __init__(self, pda: PushdownAutomaton, vocab: TokenVocabulary, walks: RuleWalks | None = None):
        self.pda, self.vocab = pda, vocab
        # rule walks, shared with the other grammars of the compiler that passes them
        self._walks = walks if walks is not None else RuleWalks()
        self._lookahead = Lookahead(pda.rules, pda.calls)
        # per rule, made on first use (a generation visits few of a big schema's rules)
        self._inner: dict[int, TokenMasks] = {}
        self._open: dict[int, TokenMasks] = {}
        self._escapes: dict[int, np.ndarray] = {}
        self._native: dict[int, tuple[WalkTable, EscapeBits]] = {}
        self._top_memo: dict[tuple[int, int], tuple[np.ndarray, np.ndarray | None]] = {}
        self._packed: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._ids: dict[int, torch.Tensor | None] = {}
        self._lock = threading.Lock()
        self.candidates_walked = 0
        # counted strings (dfa_product.Counted): a configuration stands for the one at its
        # strings' representative counts, whose mask is the same for tokens this long
        self._horizon = int(vocab.walk_lengths.max()) if len(vocab.walk_lengths) else 1
        self._same: dict[int, np.ndarray | None] = {}
        self._canonical: dict[int, int] = {}
        sorted_spellings(vocab)  # built with the grammar (once per vocabulary), not in a mask
        self._native_walk = vocab_trie(vocab)  # (C function, trie), or None: the numpy walks
        if self._native_walk is not None:
            self._trie = self._native_walk[1]
            self._trie.lists()

    @property
    def states_computed(self) -> int:
        return len(self._packed)

    def packed(self, config: int) -> torch.Tensor:
        """int32 [num_words] bitmask of the tokens allowed in `config` (EOS where it may end)."""
        canonical = self._canonical.get(config)
        if canonical is None:
            canonical = self._canonical[config] = self.pda.renamed(config, self._same_state)
        config = canonical
        with self._lock:
            mask = self._packed.get(config)
            if mask is not None:
                self._packed.move_to_end(config)
                return mask
        mask = self._compute(config)
        with self._lock:
            self._packed[config] = mask
            if len(self._packed) > MAX_MASKS:
                dropped, _ = self._packed.popitem(last=False)
                self._ids.pop(dropped, None)
        return mask

    def _same_state(self, rule: int, state: int) -> int:
        if rule not in self._same:
            counted = self.pda.rules[rule].counted
            self._same[rule] = None if counted is None else counted.same_masks(self._horizon)
        same = self._same[rule]
        return state if same is None else int(same[state])

    def allowed_ids(self, config: int) -> torch.Tensor | None:
        if config not in self._ids:
            self._ids[config] = listed_ids(self.packed(config), self.vocab)
        return self._ids[config]

    def _compute(self, config: int) -> torch.Tensor:
        pda, v = self.pda, self.vocab
        words, candidates, seen = None, None, set()
        for stack in pda.reading(config):
            top = pda.top(stack)
            inner, open_, escape_nodes = self._top_masks(*top)
            if escape_nodes:
                words = inner.copy() if words is None else np.bitwise_or(words, inner, out=words)
                self._walk_subtrees(stack, escape_nodes, words)  # what leaves the rule depends on the stack
            elif top not in seen:
                words = inner.copy() if words is None else np.bitwise_or(words, inner, out=words)
            if open_ is not None and top not in seen:
                opened = open_ & ~inner
                candidates = opened if candidates is None else np.bitwise_or(candidates, opened, out=candidates)
            seen.add(top)
        if words is None:
            words = np.zeros(v.num_words, dtype=np.int32)
        if candidates is not None:
            candidates &= ~words
            if candidates.any():
                self._walk_candidates(config, candidates, words)
        if pda.accepts(config):
            for eos in v.eos_token_ids:
                set_bit(words, eos)
        return torch.from_numpy(words)

    def _top_masks(self, rule: int, state: int) -> tuple[np.ndarray, np.ndarray | None, list[tuple[int, int]]]:
        """(inner, open, escape nodes) of a top: the tokens read inside the rule, and those
        leaving it after a byte or more: listed one by one (`open`; None: none; numpy's holds
        inner ones too, which callers take out), or (C++ walk) as trie nodes whose subtrees
        leave it, each with the rule's state before the node's byte."""
        found = self._top_memo.get((rule, state))
        if found is not None:
            return found
        native = self._native_walk
        if native is not None:
            library, trie = native
            table, escapes = self._rule_tables(rule)
            walk = lambda: trie.walk(library, table, state, self.vocab.num_words, escapes)  # noqa: E731
            found = self._walks.get(self.pda.rules[rule], escapes.key, state, walk)
        else:
            if rule not in self._inner:
                self._prepare(rule)
            inner = self._inner[rule].packed(state).numpy()
            opens = self._escapes[rule][state]
            found = (
                inner,
                self._open[rule].packed(self.pda.rules[rule].num_states + state).numpy() if opens else None,
                [],
            )
        with self._lock:
            self._top_memo[(rule, state)] = found
        return found

    def _rule_tables(self, rule: int) -> tuple[WalkTable, EscapeBits]:
        """The C++ walk's table and escape bits of `rule`, made on first use."""
        found = self._native.get(rule)
        if found is None:
            dfa = self.pda.rules[rule]
            found = WalkTable(dfa.table, dfa.dead), EscapeBits(dfa.num_states, self._escape_rows(rule))
            with self._lock:
                self._native[rule] = found
        return found

    def _escape_rows(self, rule: int) -> dict[int, int]:
        """Per boundary state of `rule` (a call or an end), the bytes that may leave it there,
        as a 256-bit int."""
        return self._lookahead.boundary_rows(rule)

    def _prepare(self, rule: int) -> None:
        """The numpy path's DFAs of `rule` (no C++ walk)."""
        dfa = self.pda.rules[rule]
        escapes = np.zeros((dfa.num_states, 256), dtype=bool)
        for s, row in self._escape_rows(rule).items():
            escapes[s] = np.unpackbits(np.frombuffer(row.to_bytes(32, "little"), np.uint8), bitorder="little")
        with self._lock:
            self._open[rule] = TokenMasks(_opened_dfa(dfa, escapes), self.vocab)
            self._escapes[rule] = _may_escape(dfa, escapes)
            self._inner[rule] = TokenMasks(_never_ending(dfa), self.vocab)

    def _walk_subtrees(self, stack: int, nodes: list[tuple[int, int]], words: np.ndarray) -> None:
        """The tokens under each trie node in `nodes` (ascending, each with the state of the
        stack's top rule before the node's byte) that `stack` reads. Where it has read the
        node's byte, each stack then reading goes on in the C++ walk of its own top rule (and
        again where tokens leave that rule); past the walk's limit on escapes, the subtree is
        walked here, node by node: a byte that dies skips its whole subtree, so ` t` (where
        `true` may start) visits ` tr` and ` th` but none of the hundreds of ` th...` tokens."""
        node_byte, depth, skip, node_tokens, token_ids = self._trie.lists()
        step, inside = self.pda.step, self.pda.inside
        found, end, states = [], -1, {}
        for node, before in nodes:
            if node < end:
                continue  # inside a subtree walked already
            end = skip[node]
            after = step(inside(stack, before), node_byte[node])
            if not after:
                continue
            found += token_ids[node_tokens[node] : node_tokens[node + 1]]
            if end == node + 1 or self._walk_below(after, node, words):
                continue
            states[depth[node]], i = after, node + 1
            while i < end:
                d = depth[i]
                state = states[d] = step(states[d - 1], node_byte[i])
                if not state:
                    i = skip[i]
                    continue
                found += token_ids[node_tokens[i] : node_tokens[i + 1]]
                i += 1
        self.candidates_walked += len(found)
        if found:
            ids = np.array(found, dtype=np.int64)
            np.bitwise_or.at(words.view(np.uint32), ids >> 5, np.uint32(1) << (ids & 31).astype(np.uint32))

    def _walk_below(self, config: int, node: int, words: np.ndarray) -> bool:
        """The tokens below `node` that `config` (reached by the node's bytes) reads, into
        `words`: per stack reading there, the C++ walk of its top rule below the node; False
        (nothing done) where a walk lists more escapes than it keeps."""
        library, trie = self._native_walk
        walks = []
        for stack in self.pda.reading(config):
            rule, state = self.pda.top(stack)
            table, escapes = self._rule_tables(rule)
            inner, open_, nested = trie.walk(library, table, state, self.vocab.num_words, escapes, below=node)
            if open_ is not None:
                return False
            walks.append((stack, inner, nested))
        for stack, inner, nested in walks:
            np.bitwise_or(words, inner, out=words)
            if nested:
                self._walk_subtrees(stack, nested, words)
        return True

    def _walk_candidates(self, config: int, candidates: np.ndarray, words: np.ndarray) -> None:
        """Walk the candidate tokens through the automaton in byte order, so a prefix shared by
        the next one is not stepped again and a dead prefix rules out every token after it
        that shares it (` the`, ` this`, ... die together at `h` where ` t` starts `true`)."""
        spellings = sorted_spellings(self.vocab)
        bits = np.unpackbits(candidates.view(np.uint8), bitorder="little")
        ranks = np.sort(spellings.rank[np.flatnonzero(bits[: len(spellings.rank)])])
        ranks = ranks[ranks >= 0]
        self.candidates_walked += len(ranks)
        if not len(ranks):
            return
        shared = np.zeros(len(ranks), dtype=np.int64)  # common prefix with the candidate before
        if len(ranks) > 1:
            shared[1:] = np.minimum.reduceat(spellings.lcp[: ranks[-1] + 1], ranks[:-1] + 1)
        token_bytes, step, ids = self.vocab.token_bytes, self.pda.step, spellings.order[ranks].tolist()
        path, dead_at = [config], len(token_bytes)
        for token, common in zip(ids, shared.tolist()):
            if common > dead_at:
                continue  # shares the prefix that died
            del path[common + 1 :]
            state, data, dead_at = path[common], token_bytes[token], len(token_bytes)
            for i in range(common, len(data)):
                state = step(state, data[i])
                if not state:
                    dead_at = i
                    break
                path.append(state)
            else:
                set_bit(words, token)


class SortedSpellings:
    """A vocabulary's non-empty spellings in byte order: `order` (token ids), `rank` per token
    (-1: no spelling) and `lcp[i]`, the bytes spelling i shares with spelling i - 1."""

    def __init__(self, token_bytes: list):
        spelled = [(bytes(b), t) for t, b in enumerate(token_bytes) if b]
        spelled.sort()
        self.order = np.array([t for _, t in spelled], dtype=np.int64)
        self.rank = np.full(len(token_bytes), -1, dtype=np.int64)
        self.rank[self.order] = np.arange(len(spelled))
        lcp = [0] + [common_prefix(a, b) for (a, _), (b, _) in zip(spelled, spelled[1:])]
        self.lcp = np.array(lcp[: len(spelled)], dtype=np.int64)


_sorted: PerVocabCache[SortedSpellings] = PerVocabCache(lambda vocab: SortedSpellings(vocab.token_bytes))


def sorted_spellings(vocab: TokenVocabulary) -> SortedSpellings:
    return _sorted.get(vocab)


def _never_ending(dfa: ByteDFA) -> ByteDFA:
    """The rule's DFA with no accepting state: its token masks never add EOS."""
    return ByteDFA(dfa.table, np.zeros_like(dfa.accepting), dfa.initial)


def _may_escape(dfa: ByteDFA, escapes: np.ndarray) -> np.ndarray:
    """Per state: a state where some byte leaves the rule is reachable in one byte or more.
    Found backwards from those states, level by level over the byte edges reversed."""
    n, dead = dfa.num_states, dfa.dead
    src = np.repeat(np.arange(n, dtype=np.int64), 256)
    dst = dfa.table[:n].ravel().astype(np.int64)
    live = dst != dead
    pairs = np.unique(dst[live] * n + src[live])  # (target, source), sorted by target
    targets, sources = pairs // n, pairs % n
    bounds = np.searchsorted(targets, np.arange(n + 1))
    reach = np.zeros(n + 1, dtype=bool)
    frontier = np.flatnonzero(escapes.any(axis=1))
    while frontier.size:
        lo, hi = bounds[frontier], bounds[frontier + 1]
        preds = sources[_ranges(lo, hi - lo)]
        frontier = np.unique(preds[~reach[preds]])
        reach[frontier] = True
    return reach


def _opened_dfa(dfa: ByteDFA, escapes: np.ndarray) -> ByteDFA:
    """Rows 0..n-1: the rule after at least one byte, where a byte may leave it (escapes[s, b])
    leading to an absorbing state (escaped); rows n..2n-1: the same states before any byte (no
    escape at the start: there the configuration's other stacks hold the calls and returns).
    Then the absorbing row and the dead row."""
    n, dead = dfa.num_states, dfa.dead
    escaped, new_dead = 2 * n, 2 * n + 1
    moved = np.where(dfa.table[:n] == dead, new_dead, dfa.table[:n]).astype(np.int32)
    after = np.where(escapes, escaped, moved).astype(np.int32)
    table = np.concatenate([after, moved, np.full((1, 256), escaped, np.int32), np.full((1, 256), new_dead, np.int32)])
    return ByteDFA(table, np.zeros(2 * n + 2, dtype=bool), n + dfa.initial)
