"""GBNF / EBNF text -> grammar rules (ast.py), as llama.cpp's grammars and SGLang's `ebnf`
parameter write them:

    root   ::= object
    object ::= "{" ws ( pair ( "," ws pair )* )? "}"
    pair   ::= string ":" ws value      # comments run to the end of the line
    digit  ::= [0-9]
    hex    ::= [0-9a-fA-F]{4}

Terminals: "..." or '...' literals and [...] classes ([^...] negated, a-z ranges), with the
escapes \\n \\r \\t \\\\ \\" \\' \\[ \\] \\- \\^ \\xHH \\uHHHH \\UHHHHHHHH; `.` is any character.
Operators: juxtaposition (sequence), `|`, `( )`, and the postfix `*` `+` `?` `{m}` `{m,}`
`{m,n}`. A rule's alternatives may span lines: a rule ends where the next `name ::=` starts.
The grammar starts at `root`. Errors are InvalidRequest(param="ebnf") naming line and column.
"""

from __future__ import annotations

from langrt.constrained.cfg.ast import Alt, AnyChar, CharClass, Literal, Node, Ref, Repeat, Seq
from langrt.errors import InvalidRequest

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "0": "\0", "f": "\f", "v": "\v", "a": "\a", "b": "\b"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
# Why 10,000: a counted repeat becomes that many copies of its item in the automaton.
MAX_REPEAT = 10_000


class EbnfError(InvalidRequest):
    def __init__(self, text: str, pos: int, message: str):
        line = text.count("\n", 0, pos) + 1
        column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        super().__init__(f"ebnf: line {line}, column {column}: {message}", param="ebnf")
        self.pos = pos


def parse_ebnf(text: str) -> dict[str, Node]:
    """The rules of `text` by name, in order of definition (raises EbnfError)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("ebnf must be a non-empty string", param="ebnf")
    return _Parser(text).grammar()


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def fail(self, message: str, pos: int | None = None):
        raise EbnfError(self.text, self.pos if pos is None else pos, message)

    def grammar(self) -> dict[str, Node]:
        rules: dict[str, Node] = {}
        self.skip_space()
        while self.pos < len(self.text):
            start = self.pos
            name = self.name()
            self.skip_space()
            if not self.text.startswith("::=", self.pos):
                self.fail(f"expected '::=' after the rule name {name!r}")
            if name in rules:
                self.fail(f"rule {name!r} is defined twice", start)
            self.pos += 3
            rules[name] = self.alternatives()
            rules[name].pos = start
            self.skip_space()
        if "root" not in rules:
            self.fail("the grammar has no rule named 'root' (where generation starts)", 0)
        return rules

    def skip_space(self) -> None:
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end + 1
            elif c.isspace():
                self.pos += 1
            else:
                return

    def name(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _NAME_CHARS:
            self.pos += 1
        if self.pos == start:
            self.fail(f"expected a rule name, found {self._found()}")
        return self.text[start : self.pos]

    def _found(self) -> str:
        return repr(self.text[self.pos]) if self.pos < len(self.text) else "the end of the grammar"

    def at_rule_start(self) -> bool:
        """A `name ::=` begins here (the end of the rule before it)."""
        save = self.pos
        try:
            if self.pos >= len(self.text) or self.text[self.pos] not in _NAME_CHARS:
                return False
            self.name()
            self.skip_space()
            return self.text.startswith("::=", self.pos)
        finally:
            self.pos = save

    def alternatives(self) -> Node:
        start = self.pos
        options = [self.sequence()]
        while self.pos < len(self.text) and self.text[self.pos] == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(options, start)

    def sequence(self) -> Node:
        start, items = self.pos, []
        while True:
            self.skip_space()
            if self.pos >= len(self.text) or self.text[self.pos] in "|)" or self.at_rule_start():
                return items[0] if len(items) == 1 else Seq(items, start)
            items.append(self.postfixed(self.primary()))

    def postfixed(self, item: Node) -> Node:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in "*+?":
                self.pos += 1
                item = Repeat(item, 1 if c == "+" else 0, 1 if c == "?" else None, item.pos)
            elif c == "{":
                lo, hi = self.counts()
                item = Repeat(item, lo, hi, item.pos)
            else:
                return item
        return item

    def counts(self) -> tuple[int, int | None]:
        start = self.pos
        close = self.text.find("}", self.pos)
        if close < 0:
            self.fail("'{' without a closing '}'")
        body = self.text[self.pos + 1 : close].replace(" ", "")
        lo_text, comma, hi_text = body.partition(",")
        if not lo_text.isdigit() or (hi_text and not hi_text.isdigit()):
            self.fail(f"a repeat count is {{m}}, {{m,}} or {{m,n}} with whole numbers, got {{{body}}}")
        lo = int(lo_text)
        hi = (int(hi_text) if hi_text else None) if comma else lo
        if hi is not None and hi < lo:
            self.fail(f"repeat {{{body}}}: the maximum is below the minimum", start)
        if max(lo, hi or 0) > MAX_REPEAT:
            self.fail(f"repeat {{{body}}}: counts above {MAX_REPEAT} are not supported", start)
        self.pos = close + 1
        return lo, hi

    def primary(self) -> Node:
        start, c = self.pos, self.text[self.pos]
        if c in "\"'":
            return Literal(self.literal(c), start)
        if c == "[":
            return self.char_class()
        if c == ".":
            self.pos += 1
            return AnyChar(start)
        if c == "(":
            self.pos += 1
            inner = self.alternatives()
            self.skip_space()
            if self.pos >= len(self.text) or self.text[self.pos] != ")":
                self.fail("'(' without a closing ')'", start)
            self.pos += 1
            return inner
        if c in _NAME_CHARS:
            return Ref(self.name(), start)
        self.fail(f"unexpected {self._found()}")

    def literal(self, quote: str) -> str:
        start, out = self.pos, []
        self.pos += 1
        while True:
            if self.pos >= len(self.text):
                self.fail("a literal without its closing quote", start)
            c = self.text[self.pos]
            if c == quote:
                self.pos += 1
                return "".join(out)
            out.append(self.char())

    def char(self) -> str:
        """One character of a literal or class, escapes decoded."""
        c = self.text[self.pos]
        if c != "\\":
            self.pos += 1
            return c
        if self.pos + 1 >= len(self.text):
            self.fail("an escape at the end of the grammar")
        e = self.text[self.pos + 1]
        if e in _HEX_ESCAPES:
            digits = self.text[self.pos + 2 : self.pos + 2 + _HEX_ESCAPES[e]]
            if len(digits) != _HEX_ESCAPES[e] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self.fail(f"\\{e} takes {_HEX_ESCAPES[e]} hex digits")
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                self.fail(f"\\{e}{digits} is not a Unicode character")
            self.pos += 2 + len(digits)
            return chr(code)
        self.pos += 2
        return _SIMPLE_ESCAPES.get(e, e)

    def char_class(self) -> Node:
        start = self.pos
        self.pos += 1
        negated = self.text.startswith("^", self.pos)
        self.pos += negated
        ranges = []
        while True:
            if self.pos >= len(self.text):
                self.fail("'[' without a closing ']'", start)
            if self.text[self.pos] == "]" and (ranges or self.pos > start + 1 + negated):
                self.pos += 1
                return CharClass(ranges, negated, start)
            lo = self.char()
            hi = lo
            if self.text.startswith("-", self.pos) and not self.text.startswith("-]", self.pos):
                self.pos += 1
                hi = self.char()
                if ord(hi) < ord(lo):
                    self.fail(f"class range {lo!r}-{hi!r} runs backwards")
            ranges.append((ord(lo), ord(hi)))
