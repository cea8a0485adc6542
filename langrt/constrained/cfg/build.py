"""Grammar text -> rules (torch-free: the main process checks a request's grammar with it) and
rules -> pushdown automaton (each rule's DFA built by `build_rule`, in-process or by the
grammar worker)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

from langrt.constrained.byte_dfa import ByteDFA
from langrt.constrained.cfg.ebnf import EbnfError, parse_ebnf
from langrt.constrained.cfg.rules import RuleSet, compile_rules

BuildRule = Callable[[str], tuple[ByteDFA, dict]]

# Why 50,000: a cached DFA row is 1 KB (256 int32), so the cache holds at most ~50 MB; the rules
# schemas share (any value, strings, small enums) are a few hundred states each.
RULE_CACHE_MAX_STATES = 50_000


class RuleCache:
    """Rule DFAs by body text, shared by the grammars one compiler builds: schemas repeat the
    same rules (any JSON value, strings, numbers, enums), and the same text is the same DFA
    with the same calls. Least recently used first out, bounded by the states kept."""

    def __init__(self, max_states: int = RULE_CACHE_MAX_STATES):
        self.max_states, self.states = max_states, 0
        self._found: OrderedDict[str, tuple[ByteDFA, dict]] = OrderedDict()
        self._lock = threading.Lock()

    def wrap(self, build_rule: BuildRule) -> BuildRule:
        def cached(body: str) -> tuple[ByteDFA, dict]:
            with self._lock:
                found = self._found.get(body)
                if found is not None:
                    self._found.move_to_end(body)
                    return found
            found = build_rule(body)
            self._keep(body, found)
            return found

        return cached

    def _keep(self, body: str, found: tuple[ByteDFA, dict]) -> None:
        size = found[0].num_states
        if size > self.max_states // 4:
            return  # a big rule is rarely shared; it would push out many small ones
        with self._lock:
            if body in self._found:
                return
            self._found[body] = found
            self.states += size
            while self.states > self.max_states:
                _, (dfa, _) = self._found.popitem(last=False)
                self.states -= dfa.num_states


def ebnf_rules(text: str) -> RuleSet:
    """The rules of a GBNF/EBNF grammar starting at `root` (raises EbnfError naming the
    position of what is wrong)."""
    rules = parse_ebnf(text)

    def fail(pos: int, message: str):
        raise EbnfError(text, pos, message)

    return compile_rules(rules, "root", fail)


def build_automaton(rules: RuleSet, build_rule: BuildRule, max_states: int):
    """The pushdown automaton of `rules` (ValueError if a rule's regex is refused or the
    rules' DFAs hold more than `max_states` states in all)."""
    from langrt.constrained.cfg.pda import PushdownAutomaton

    dfas, calls, total = [], [], 0
    for name, body in zip(rules.names, rules.bodies):
        try:
            dfa, edges = build_rule(body)
        except ValueError as e:
            raise ValueError(f"rule {name!r}: {e}") from None
        total += dfa.num_states
        if total > max_states:
            raise ValueError(f"the grammar's automata have over {max_states} states")
        dfas.append(dfa)
        calls.append(edges)
    return PushdownAutomaton(dfas, calls, rules.names)


def local_automaton(rules: RuleSet, max_states: int):
    """The automaton of `rules`, each rule's DFA built in this process (tests, benchmarks)."""
    from langrt.constrained.byte_dfa import build_rule_dfa

    return build_automaton(rules, lambda body: build_rule_dfa(body, max_states), max_states)


def full_match(automaton, text: str) -> bool:
    """`text` is a whole sentence of the automaton (a ByteDFA or a pushdown automaton)."""
    state = automaton.initial
    for byte in text.encode("utf-8"):
        state = automaton.step(state, byte)
        if state == automaton.dead:
            return False
    return automaton.accepts(state)
