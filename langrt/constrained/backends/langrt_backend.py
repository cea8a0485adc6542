"""`--grammar-backend langrt` (the default): langrt's own engine (constrained/grammar.py) as a
backend of the compile service.

Building a regex's automaton is usually milliseconds, but a pathological regex (`(a|b)*a(a|b){20}`)
takes minutes and gigabytes, in Python code that holds the GIL. So automata are built in a
separate process that is killed when it runs past the limit: only the request that asked for that
grammar fails, and the next compile starts a fresh worker.
"""

from __future__ import annotations

import subprocess
import sys
import time

from langrt import pickle_pipe
from langrt.constrained.byte_dfa import ByteDFA
from langrt.constrained.cfg.build import RuleCache
from langrt.constrained.cfg.walk_cache import RuleWalks
from langrt.constrained.grammar import MAX_DFA_STATES, Grammar
from langrt.constrained.spec import GrammarSpec
from langrt.constrained.vocab import TokenVocabulary
from langrt.errors import InvalidRequest


class _Worker:
    """`python -m langrt.constrained.byte_dfa` with length-prefixed pickles over its pipes
    (a plain subprocess: the scheduler is itself a daemonic child, which may not fork others
    through multiprocessing)."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "langrt.constrained.byte_dfa"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def build(self, regex: str, timeout_s: float, is_rule: bool) -> tuple[ByteDFA, dict | None]:
        """The regex's DFA; for a grammar rule's body, also its calls (byte_dfa.build_rule_dfa)."""
        pickle_pipe.send(self.process.stdin, (regex, MAX_DFA_STATES, is_rule))
        try:
            ok, payload = pickle_pipe.receive(self.process.stdout, timeout_s)
        except EOFError:
            raise ValueError("the grammar worker exited") from None
        if not ok:
            raise ValueError(payload)
        *parts, calls = payload
        return ByteDFA(*parts), calls

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(5)


class LangrtBackend:
    """Compiles on the service's thread, one grammar at a time (the worker, the rule cache and the
    rule walks are that thread's alone)."""

    stops_itself = True  # the worker is killed at the limit (base.GrammarBackend)

    def __init__(self, vocab: TokenVocabulary, timeout_s: float):
        self.vocab = vocab
        self.timeout_s = timeout_s
        self._worker: _Worker | None = None
        self._rules = RuleCache()
        self._walks = RuleWalks()  # rule masks the grammars share (mask fills and compiles)

    def compile(self, spec: GrammarSpec) -> Grammar:
        source = spec.translate()
        if isinstance(source, str):
            return Grammar(self._build(source, False, "regex")[0], self.vocab, source)
        from langrt.constrained.cfg.build import build_automaton

        deadline = time.monotonic() + self.timeout_s
        try:
            build = self._rules.wrap(lambda body: self._build(body, True, spec.kind, deadline))
            pda = build_automaton(source, build, MAX_DFA_STATES)
        except ValueError as e:
            raise InvalidRequest(f"{spec.kind} not supported: {e}", param=spec.kind) from None
        return Grammar(pda, self.vocab, spec.text, self._walks)

    def _build(self, regex: str, is_rule: bool, param: str, deadline: float | None = None):
        """(DFA, calls) built by the worker, within the time left (a grammar's rules share one
        time limit)."""
        if self._worker is None or not self._worker.alive:
            self._worker = _Worker()
        timeout_s = self.timeout_s if deadline is None else max(deadline - time.monotonic(), 0.001)
        try:
            return self._worker.build(regex, timeout_s, is_rule)
        except TimeoutError:
            self._worker.kill()
            self._worker = None
            raise InvalidRequest(
                f"grammar compile exceeded the time limit of {self.timeout_s:g} s (the {param}'s automaton "
                "explodes; simplify it)",
                param=param,
            ) from None
        except ValueError as e:
            if is_rule:
                raise
            raise InvalidRequest(f"regex not supported: {e}", param="regex") from None

    def close(self) -> None:
        if self._worker is not None:
            self._worker.kill()
