"""Grammar trees (ast.py) -> the rules a pushdown automaton runs (pda.py): each rule's body as
a regex in which calling another rule is one marker character (byte_dfa.call_marker).

Only rules that must be called are: the start rule, the recursive ones (the automaton's stack
does the recursion, so nesting is unbounded), and rules too big to copy into every caller. The
rest are copied in, so most grammars are a few rules and most bytes stay inside one DFA.

Left recursion (`expr ::= expr "+" term`, a rule reaching itself before reading a character) is
refused: a top-down automaton would push forever. Grammars write it as repetition instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from langrt.constrained.byte_dfa import MAX_RULES, call_marker
from langrt.constrained.cfg.ast import Alt, AnyChar, CharClass, Literal, Node, Ref, Regex, Repeat, Seq, children

# Why 2,000: a copied rule costs DFA states in each caller, a called one a push and a pop per
# use (and masks that look past the rule's end); past a few thousand characters of regex the
# copies cost more.
INLINE_MAX_CHARS = 2_000
# The characters constrained text may hold: plane 16 carries the markers.
_TOP = 0xFFFFF


@dataclass
class RuleSet:
    names: list[str]  # rule i's name; rule 0 starts the grammar
    bodies: list[str]  # rule i's body: regex text with call markers


Fail = Callable[[int, str], None]  # (position, message) -> raises


def compile_rules(rules: dict[str, Node], start: str, fail: Fail) -> RuleSet:
    """The rules reachable from `start`, ready for the automaton; `fail` raises for undefined
    names and left recursion."""
    _check_names(rules, fail)
    nullable = _nullable(rules)
    _check_left_recursion(rules, nullable, fail)
    return _Translator(rules, start).run()


def _refs(node: Node):
    if isinstance(node, Ref):
        yield node
    for child in children(node):
        yield from _refs(child)


def _check_names(rules: dict[str, Node], fail: Fail) -> None:
    for body in rules.values():
        for ref in _refs(body):
            if ref.name not in rules:
                fail(ref.pos, f"no rule named {ref.name!r}")


def _nullable(rules: dict[str, Node]) -> dict[str, bool]:
    """Which rules match the empty text (a fixed point)."""
    known = dict.fromkeys(rules, False)
    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if not known[name] and _node_nullable(body, known):
                known[name] = changed = True
    return known


def _node_nullable(node: Node, known: dict[str, bool]) -> bool:
    if isinstance(node, Literal):
        return not node.text
    if isinstance(node, Regex):
        return getattr(node, "nullable", False)
    if isinstance(node, Ref):
        return known[node.name]
    if isinstance(node, Seq):
        return all(_node_nullable(i, known) for i in node.items)
    if isinstance(node, Alt):
        return any(_node_nullable(o, known) for o in node.options)
    if isinstance(node, Repeat):
        return node.lo == 0 or _node_nullable(node.item, known)
    return False  # a character


def _first_refs(node: Node, nullable: dict[str, bool]) -> list[Ref]:
    """The rules `node` may call before reading a character."""
    if isinstance(node, Ref):
        return [node]
    if isinstance(node, Seq):
        found = []
        for item in node.items:
            found += _first_refs(item, nullable)
            if not _node_nullable(item, nullable):
                break
        return found
    if isinstance(node, Repeat) and node.hi == 0:
        return []
    return [r for child in children(node) for r in _first_refs(child, nullable)]


def _check_left_recursion(rules: dict[str, Node], nullable: dict[str, bool], fail: Fail) -> None:
    graph = {name: _first_refs(body, nullable) for name, body in rules.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name) :] + [name]
            fail(
                rules[name].pos,
                f"left recursion: {' -> '.join(cycle)} (a rule reaching itself before reading a "
                'character); write it with repetition, e.g. list ::= item ("," item)*',
            )
        if name in done:
            return
        for ref in graph[name]:
            visit(ref.name, path + [name])
        done.add(name)

    for name in rules:
        visit(name, [])


def _recursive(rules: dict[str, Node]) -> set[str]:
    """Rules that reach themselves through references."""
    edges = {name: {r.name for r in _refs(body)} for name, body in rules.items()}
    found = set()
    for name in rules:
        seen, todo = set(), list(edges[name])
        while todo:
            n = todo.pop()
            if n == name:
                found.add(name)
                break
            if n not in seen:
                seen.add(n)
                todo += edges[n]
    return found


class _Translator:
    def __init__(self, rules: dict[str, Node], start: str):
        self.rules = rules
        self.ids: dict[str, int] = {start: 0}
        for name in sorted(_recursive(rules) - {start}, key=list(rules).index):
            self.ids[name] = len(self.ids)
        self.copies: dict[str, str] = {}

    def run(self) -> RuleSet:
        bodies: dict[int, str] = {}
        while len(bodies) < len(self.ids):  # translating may promote copies to called rules
            for name, i in list(self.ids.items()):
                if i not in bodies:
                    bodies[i] = self.regex(self.rules[name])
        if len(self.ids) > MAX_RULES:
            raise ValueError(f"the grammar needs {len(self.ids)} rules, over the limit of {MAX_RULES}")
        names = sorted(self.ids, key=self.ids.__getitem__)
        return RuleSet(names, [bodies[i] for i in range(len(names))])

    def ref(self, name: str) -> str:
        if name not in self.ids:
            copy = self.copies.get(name)
            if copy is None:
                copy = self.copies[name] = self.regex(self.rules[name])
            if len(copy) <= INLINE_MAX_CHARS:
                return copy
            self.ids[name] = len(self.ids)
        return call_marker(self.ids[name])

    def regex(self, node: Node) -> str:
        """`node` as one regex atom (safe to concatenate and to repeat)."""
        if isinstance(node, Literal):
            return _literal(node.text)
        if isinstance(node, CharClass):
            return _char_class(node.ranges, node.negated)
        if isinstance(node, AnyChar):
            return "[\\x{0}-\\x{%X}]" % _TOP
        if isinstance(node, Regex):
            return f"(?:{node.regex})"
        if isinstance(node, Ref):
            return self.ref(node.name)
        if isinstance(node, Seq):
            return "(?:" + "".join(self.regex(i) for i in node.items) + ")"
        if isinstance(node, Alt):
            return "(?:" + "|".join(self.regex(o) for o in node.options) + ")"
        return self.regex(node.item) + repeat_suffix(node.lo, node.hi)


def repeat_suffix(lo: int, hi: int | None) -> str:
    """The regex (and EBNF) suffix repeating an item lo to hi times (hi None: unbounded)."""
    if hi is None:
        return {0: "*", 1: "+"}.get(lo, "{%d,}" % lo)
    if (lo, hi) == (0, 1):
        return "?"
    return "{%d}" % lo if lo == hi else "{%d,%d}" % (lo, hi)


def _char(code: int) -> str:
    c = chr(code)
    return c if c.isascii() and c.isalnum() else "\\x{%X}" % code


def _literal(text: str) -> str:
    if len(text) == 1:
        return _char(ord(text))
    return "(?:" + "".join(_char(ord(c)) for c in text) + ")"


def _char_class(ranges: list[tuple[int, int]], negated: bool) -> str:
    parts = "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges if lo <= _TOP)
    if negated:
        return "[^%s\\x{%X}-\\x{10FFFF}]" % (parts, _TOP + 1)
    clipped = [(lo, min(hi, _TOP)) for lo, hi in ranges if lo <= _TOP]
    if not clipped:
        return "[^\\x{0}-\\x{10FFFF}]"  # matches nothing
    return "[" + "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in clipped) + "]"
