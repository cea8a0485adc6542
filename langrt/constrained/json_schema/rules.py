"""A schema's values as grammar rules (cfg/pda.py runs them): where a value's regex would recurse
or grow past RULE_MIN_CHARS, the compiler writes a call to a rule instead of copying it in.

Recursion through `$ref` then costs one stack frame per level of the instance, not one copy of
the schema per level of unrolling, and a big subschema used in many places is one automaton, so
a schema's size is the sum of its parts, not their product.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from langrt.constrained.byte_dfa import call_marker

# Why 2,000: a copied value costs automaton states in each caller, a called one a push and a
# pop (and masks that look past the rule's end); past a few thousand characters of regex the
# copies cost more (the same bound as cfg/rules.py's).
RULE_MIN_CHARS = 2_000
# A rule that no text matches (a recursive value found unsatisfiable after it was called).
NOTHING = "[^\\x{0}-\\x{10FFFF}]"


_CALL = re.compile(r"\\x\{1[0-9A-F]{5}\}")


def calls_any(regex: str) -> bool:
    """`regex` holds a rule call (byte_dfa.call_marker's text)."""
    return _CALL.search(regex) is not None


@dataclass
class RuleBook:
    """The rules a schema needs. Rule 0 is the whole schema's value; the others are keyed by
    what they stand for (the schemas of a value position, or "any value")."""

    ids: dict = field(default_factory=dict)
    bodies: dict = field(default_factory=dict)
    active: set = field(default_factory=set)  # values being written now: meeting one is recursion

    def call(self, key) -> str:
        """The regex text calling the rule for `key` (numbered on first call)."""
        if key not in self.ids:
            self.ids[key] = len(self.ids) + 1
        return call_marker(self.ids[key])

    def settle(self, key, regex: str | None) -> str | None:
        """`regex` written for `key`: a call if the value recursed or is big, else the regex."""
        if key not in self.ids and (regex is None or len(regex) <= RULE_MIN_CHARS):
            return regex
        marker = self.call(key)
        self.bodies[self.ids[key]] = NOTHING if regex is None else regex
        return marker

    def rule_for(self, regex: str) -> str:
        """A call to a rule whose body is `regex` (one rule per distinct text)."""
        key = ("text", regex)
        marker = self.call(key)
        self.bodies[self.ids[key]] = regex
        return marker

    def rule_set(self, root: str):
        """The rules, root first (cfg.rules.RuleSet), or the root regex alone when it calls none."""
        if not self.ids:
            return root
        from langrt.constrained.cfg.rules import RuleSet

        names = ["root"] + [f"value{i}" for i in range(1, len(self.ids) + 1)]
        return RuleSet(names, [root] + [self.bodies[i] for i in range(1, len(self.ids) + 1)])
