"""langrt's grammar inputs written for the other grammar engines (`--grammar-backend xgrammar |
llguidance`): its EBNF and choices in xgrammar's EBNF and in llguidance's Lark, and the triggers
of a structural tag.

The `ebnf` parameter means one language whatever engine serves it: langrt parses the text (syntax
errors name line and column as always), then writes the rules out again for the engine. Each
engine reads its own dialect differently (xgrammar has no `.` and no empty alternative,
llguidance's GBNF converter misreads `\\u` escapes and comments inside a rule), so the rules are
written in the plainest form both read: literal and class characters escaped by code point,
every compound inside parentheses, and rules renamed `r0`, `r1`, ... in definition order (langrt
allows `-` and `.` in names; Lark's rule names are lowercase words).
"""

from __future__ import annotations

from langrt.constrained.cfg.ast import Alt, AnyChar, CharClass, Literal, Node, Ref, Repeat, Seq, children
from langrt.constrained.cfg.ebnf import EbnfError, parse_ebnf
from langrt.constrained.cfg.rules import repeat_suffix

_MAX_CODE_POINT = 0x10FFFF


def parse_rules(text: str) -> dict[str, Node]:
    """The rules of a langrt EBNF text, checked as langrt checks them before compiling (raises
    EbnfError naming the position). Left recursion is allowed here: both engines parse it."""
    rules = parse_ebnf(text)
    for body in rules.values():
        for ref in _refs(body):
            if ref.name not in rules:
                raise EbnfError(text, ref.pos, f"no rule named {ref.name!r}")
    return rules


def _refs(node: Node):
    if isinstance(node, Ref):
        yield node
    for child in children(node):
        yield from _refs(child)


def xgrammar_ebnf(rules: dict[str, Node]) -> str:
    """xgrammar's EBNF for `rules`, starting at `root`."""
    names = {name: "root" if name == "root" else f"r{i}" for i, name in enumerate(rules)}
    writer = _Writer(names, _xgrammar_literal, _xgrammar_class)
    return "\n".join(f"{names[name]} ::= {writer.node(body)}" for name, body in rules.items()) + "\n"


def lark(rules: dict[str, Node]) -> str:
    """llguidance's Lark for `rules`, starting at `root`."""
    names = {name: f"r{i}" for i, name in enumerate(rules)}
    writer = _Writer(names, lark_literal, _lark_class)
    lines = ["%llguidance {}", f"start: {names['root']}"]
    lines += [f"{names[name]}: {writer.node(body)}" for name, body in rules.items()]
    return "\n".join(lines) + "\n"


def choices_xgrammar_ebnf(choices: list[str]) -> str:
    return "root ::= " + " | ".join(_xgrammar_literal(c) for c in choices) + "\n"


def choices_lark(choices: list[str]) -> str:
    return "%llguidance {}\nstart: " + " | ".join(lark_literal(c) for c in choices) + "\n"


class _Writer:
    """Writes a rule body with the dialect's literal and class spellings."""

    def __init__(self, names: dict[str, str], literal, char_class):
        self.names = names
        self.literal = literal
        self.char_class = char_class

    def node(self, node: Node) -> str:
        if isinstance(node, Literal):
            return self.literal(node.text)
        if isinstance(node, CharClass):
            return self.char_class(node.ranges, node.negated)
        if isinstance(node, AnyChar):
            return self.char_class([(0, _MAX_CODE_POINT)], False)
        if isinstance(node, Ref):
            return self.names[node.name]
        if isinstance(node, Seq):
            return " ".join(f"({self.node(item)})" for item in node.items) if node.items else self.literal("")
        if isinstance(node, Alt):
            return " | ".join(f"({self.node(option)})" for option in node.options)
        if isinstance(node, Repeat):
            return f"({self.node(node.item)}){repeat_suffix(node.lo, node.hi)}"
        raise TypeError(f"no EBNF spelling for {type(node).__name__}")


def _xgrammar_char(cp: int) -> str:
    c = chr(cp)
    if c.isascii() and c.isalnum() or c in " _":
        return c
    return "\\u%04X" % cp if cp <= 0xFFFF else "\\U%08X" % cp


def _xgrammar_literal(text: str) -> str:
    return '"' + "".join(_xgrammar_char(ord(c)) for c in text) + '"'


def _xgrammar_class(ranges: list[tuple[int, int]], negated: bool) -> str:
    body = "".join(
        _xgrammar_char(lo) if lo == hi else f"{_xgrammar_char(lo)}-{_xgrammar_char(hi)}" for lo, hi in ranges
    )
    return f"[{'^' if negated else ''}{body}]"


def lark_literal(text: str) -> str:
    """A Lark string literal: quotes and backslashes escaped, ASCII control characters as
    `\\uXXXX`, the rest as written."""
    return '"' + "".join(_lark_char(c) for c in text) + '"'


def _lark_char(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    return "\\u%04x" % ord(c) if ord(c) < 0x20 or ord(c) == 0x7F else c


def _lark_class(ranges: list[tuple[int, int]], negated: bool) -> str:
    char = "\\x{%X}".__mod__
    body = "".join(char(lo) if lo == hi else f"{char(lo)}-{char(hi)}" for lo, hi in ranges)
    return f"/[{'^' if negated else ''}{body}]/"


def minimal_triggers(triggers: list[str]) -> list[str]:
    """The triggers no other trigger is a prefix of. The same structural tag: where a longer
    trigger occurs its prefix does too, and every begin that starts with the longer one starts
    with the prefix; but both engines want each begin to start with exactly one trigger."""
    return [t for t in triggers if not any(o != t and t.startswith(o) for o in triggers)]
