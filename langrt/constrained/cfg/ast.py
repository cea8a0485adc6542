"""A context-free grammar as trees of nodes, one per rule, before it is compiled (rules.py).
Positions point into the source text (EBNF), for error messages."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False)
class Node:
    pos: int


@dataclass(eq=False)
class Literal(Node):
    text: str

    def __init__(self, text: str, pos: int = 0):
        self.text, self.pos = text, pos


@dataclass(eq=False)
class CharClass(Node):
    ranges: list[tuple[int, int]]  # inclusive code point ranges
    negated: bool

    def __init__(self, ranges: list[tuple[int, int]], negated: bool = False, pos: int = 0):
        self.ranges, self.negated, self.pos = ranges, negated, pos


@dataclass(eq=False)
class AnyChar(Node):
    def __init__(self, pos: int = 0):
        self.pos = pos


@dataclass(eq=False)
class Ref(Node):
    name: str

    def __init__(self, name: str, pos: int = 0):
        self.name, self.pos = name, pos


@dataclass(eq=False)
class Regex(Node):
    """A terminal given as regex text (Rust `regex` syntax, no plane-16 characters): how the
    JSON-schema compiler hands over what it already writes as regexes."""

    regex: str

    def __init__(self, regex: str, pos: int = 0):
        self.regex, self.pos = regex, pos


@dataclass(eq=False)
class Seq(Node):
    items: list[Node]

    def __init__(self, items: list[Node], pos: int = 0):
        self.items, self.pos = items, pos


@dataclass(eq=False)
class Alt(Node):
    options: list[Node]

    def __init__(self, options: list[Node], pos: int = 0):
        self.options, self.pos = options, pos


@dataclass(eq=False)
class Repeat(Node):
    item: Node
    lo: int
    hi: int | None  # None: unbounded

    def __init__(self, item: Node, lo: int, hi: int | None, pos: int = 0):
        self.item, self.lo, self.hi, self.pos = item, lo, hi, pos


def children(node: Node) -> list[Node]:
    if isinstance(node, Seq):
        return node.items
    if isinstance(node, Alt):
        return node.options
    if isinstance(node, Repeat):
        return [node.item]
    return []
