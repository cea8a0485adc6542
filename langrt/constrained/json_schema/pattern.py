"""`pattern` for the JSON-schema compiler: an ECMA-262 regex over the DECODED string, rewritten
as a regex over the JSON text between the quotes.

A pattern is parsed here (a subset of ECMA-262), never handed to a regex engine as is, because
it constrains decoded characters while the output is JSON text: `"` must appear as `\\"`, a
newline as `\\n`, and so on. Rewriting also fixes the search semantics: `abc` means "contains
abc" (an unanchored search), `^abc$` means "is abc".

JSON Schema says ECMA-262 while jsonschema (Python) checks with `re.search`; where the two
differ (`\\d` is Unicode in Python, `.` stops at U+2028 only in ECMA, `$` also matches before a
final newline in Python) the rewrite keeps only what both accept. Every character set is kept
as an under-approximation `lo` (in both engines' sets) and an over-approximation `hi` (in
either), so negation stays sound: lo(not X) = not hi(X). Anything whose meaning differs or
cannot be expressed (lookaround, backreferences, word boundaries, anchors inside groups,
characters outside the BMP) is refused, naming `pattern` (or `format`).

Formats (formats.py) are written as patterns in the same subset, so they share the translation
and the length analysis (`format` with `minLength`/`maxLength`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from langrt.constrained.json_schema import regex as rx
from langrt.constrained.json_schema.char_sets import BMP, NON_ASCII, DIGIT, WORD, SPACE_LO, SPACE_HI, LINE_END
from langrt.errors import UnsupportedSchema

_CLASS_ESCAPES = {  # name -> (lo, hi)
    "d": (DIGIT, DIGIT + NON_ASCII),
    "w": (WORD, WORD + NON_ASCII),
    "s": (SPACE_LO, SPACE_HI),
}
_CHAR_ESCAPES = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13}
_SYNTAX = set("^$\\.*+?()[]{}|/-")


# AST: ("set", ranges) one character | ("any",) one character, escapes allowed | ("seq", [..]) |
# ("alt", [..]) | ("rep", node, lo, hi or None) | ("bol",) / ("eol",) anchors (parse only)


@dataclass
class Translated:
    """A pattern as alternatives, each a ("seq", ...) node over the whole string (search
    semantics already applied: unanchored ends became ("rep", ("any",), 0, None))."""

    alts: list
    source: str
    param: str


def _refuse(param: str, source: str, why: str) -> UnsupportedSchema:
    return UnsupportedSchema(f"{param} {source!r}: {why}", param=param)


@lru_cache(maxsize=256)
def translate(pattern: str, param: str = "pattern") -> Translated:
    alts = _spliced(_Parser(pattern, param).parse())
    out = []
    for terms in alts:
        start = bool(terms) and terms[0] == ("bol",)
        terms = terms[1:] if start else terms
        end = bool(terms) and terms[-1] == ("eol",)
        terms = terms[:-1] if end else terms
        if any(_has_anchor(t) for t in terms):
            raise _refuse(param, pattern, "anchors (^, $) are supported only at the start and end of the pattern")
        anything = ("rep", ("any",), 0, None)
        out.append(("seq", ([] if start else [anything]) + list(terms) + ([] if end else [anything])))
    return Translated(out, pattern, param)


def _spliced(alts: list[list]) -> list[list]:
    """An alternative that is one group, `(^a$)|(^b$)`, is its group's alternatives: anchors in
    them then stand at the pattern's own start and end."""
    out = []
    for terms in alts:
        if len(terms) == 1 and terms[0][0] == "alt":
            out += _spliced([seq[1] for seq in terms[0][1]])
        else:
            out.append(terms)
    return out


def _has_anchor(node) -> bool:
    kind = node[0]
    if kind in ("bol", "eol"):
        return True
    if kind in ("seq", "alt"):
        return any(_has_anchor(n) for n in node[1])
    if kind == "rep":
        return _has_anchor(node[1])
    return False


class _Parser:
    def __init__(self, src: str, param: str):
        self.s, self.i, self.param = src, 0, param

    def fail(self, why: str) -> UnsupportedSchema:
        return _refuse(self.param, self.s, f"{why} (at position {self.i})")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def parse(self) -> list[list]:
        if any(ord(c) > 0xFFFF for c in self.s):
            raise self.fail("characters outside the Basic Multilingual Plane are not supported")
        alts = self.disjunction()
        if self.i != len(self.s):
            raise self.fail("unbalanced ')'")
        return alts

    def disjunction(self) -> list[list]:
        alts = [self.alternative()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.alternative())
        return alts

    def alternative(self) -> list:
        terms = []
        while self.peek() not in ("", "|", ")"):
            terms.append(self.term())
        return terms

    def term(self):
        c = self.peek()
        if c in "^$":
            self.i += 1
            if self.peek() and self.peek() in "*+?{":
                raise self.fail("quantified anchor")
            return ("bol",) if c == "^" else ("eol",)
        atom = self.atom()
        return self.quantifier(atom)

    def quantifier(self, atom):
        c = self.peek()
        if c == "*":
            lo, hi = 0, None
        elif c == "+":
            lo, hi = 1, None
        elif c == "?":
            lo, hi = 0, 1
        elif c == "{":
            lo, hi = self.braces()
        else:
            return atom
        self.i += 1
        if self.peek() == "?":  # lazy: the same strings match
            self.i += 1
        if self.peek() and self.peek() in "*+?{":
            raise self.fail("a quantifier after a quantifier (possessive in Python, an error in ECMA-262)")
        if hi is not None and hi < lo:
            raise self.fail("quantifier {m,n} with n < m")
        return ("rep", atom, lo, hi)

    def braces(self) -> tuple[int, int | None]:
        end = self.s.find("}", self.i)
        body = self.s[self.i + 1 : end] if end > 0 else ""
        lo, comma, hi = body.partition(",")
        if not lo.isdigit() or (hi and not hi.isdigit()) or not lo.isascii() or not hi.isascii():
            # ECMA-262 (Annex B) reads such a brace as a literal, Python may read a quantifier.
            raise self.fail("'{' that is not a quantifier {n}, {n,} or {n,m}")
        self.i = end
        return int(lo), (int(hi) if hi else None if comma else int(lo))

    def atom(self):
        c = self.peek()
        self.i += 1
        if c == ".":
            return ("set", rx.complement(LINE_END))
        if c == "(":
            return self.group()
        if c == "[":
            return ("set", self.char_class())
        if c == "\\":
            lo, _ = self.escape(in_class=False)
            return ("set", lo)
        if c in "*+?":
            raise self.fail("nothing to repeat")
        if c == "{":
            raise self.fail("'{' that is not a quantifier")
        return ("set", [(ord(c), ord(c))])

    def group(self):
        if self.s.startswith("?:", self.i):
            self.i += 2
        elif self.s.startswith("?<", self.i) and self.s[self.i + 2 : self.i + 3] not in ("=", "!"):
            end = self.s.find(">", self.i)
            if end < 0:
                raise self.fail("unterminated group name")
            self.i = end + 1
        elif self.peek() == "?":
            raise self.fail("lookaround and inline flags are not supported")
        alts = self.disjunction()
        if self.peek() != ")":
            raise self.fail("missing ')'")
        self.i += 1
        return ("alt", [("seq", a) for a in alts])

    def escape(self, in_class: bool) -> tuple[list, list]:
        """After a backslash: (lo, hi) sets of the escaped character or class."""
        c = self.peek()
        self.i += 1
        if c == "":
            raise self.fail("pattern ends with '\\'")
        if c.lower() in _CLASS_ESCAPES:
            lo, hi = _CLASS_ESCAPES[c.lower()]
            return (lo, hi) if c.islower() else (rx.complement(hi), rx.complement(lo))
        if c in _CHAR_ESCAPES:
            cp = _CHAR_ESCAPES[c]
        elif c == "b" and in_class:
            cp = 8
        elif c == "0" and not self.peek().isdigit():
            cp = 0
        elif c in "xu":
            width = 2 if c == "x" else 4
            digits = self.s[self.i : self.i + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"\\{c} needs {width} hex digits")
            self.i += width
            cp = int(digits, 16)
            if rx.SURROGATES[0] <= cp <= rx.SURROGATES[1]:
                raise self.fail("surrogate escapes are read differently by ECMA-262 and Python")
        elif c in _SYNTAX or (c.isascii() and not c.isalnum() and c != "_"):
            cp = ord(c)
        elif c in "bB":
            raise self.fail("word boundaries (\\b, \\B) are not supported")
        elif c.isdigit() or c == "k":
            raise self.fail("backreferences are not supported")
        else:
            raise self.fail(f"escape \\{c} is not supported")
        return [(cp, cp)], [(cp, cp)]

    def char_class(self) -> list:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        if self.peek() == "]":
            raise self.fail("empty class '[]' / '[^]' (read differently by ECMA-262 and Python)")
        lo_parts: list = []
        hi_parts: list = []
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("missing ']'")
            if c == "]":
                self.i += 1
                break
            if c == "[" or self.s[self.i : self.i + 2] in ("&&", "--", "~~", "||"):
                raise self.fail("nested sets and set operations in a class are not supported")
            lo, hi, single = self.class_atom()
            if self.peek() == "-" and self.s[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                lo2, _, single2 = self.class_atom()
                if single is None or single2 is None:
                    raise self.fail("a class escape cannot bound a range")
                if single2 < single:
                    raise self.fail("range out of order in class")
                lo = hi = [(single, single2)]
            lo_parts += lo
            hi_parts += hi
        lo_set, hi_set = rx.normalize(lo_parts), rx.normalize(hi_parts)
        return rx.complement(hi_set) if negate else lo_set

    def class_atom(self):
        c = self.peek()
        self.i += 1
        if c == "\\":
            lo, hi = self.escape(in_class=True)
            single = lo[0][0] if len(lo) == 1 and lo[0][0] == lo[0][1] and lo == hi else None
            return lo, hi, single
        return [(ord(c), ord(c))], [(ord(c), ord(c))], ord(c)


# ---------------------------------------------------------------------------------------------
# Length analysis and the length keywords


def char_length(node) -> tuple[int, int | None]:
    """(min, max) decoded characters a node matches (max None: unbounded)."""
    kind = node[0]
    if kind in ("set", "any"):
        return 1, 1
    if kind == "rep":
        a, b = char_length(node[1])
        return a * node[2], None if node[3] is None or b is None else b * node[3]
    lengths = [char_length(n) for n in node[1]]
    if kind == "seq":
        return sum(a for a, _ in lengths), None if any(b is None for _, b in lengths) else sum(b for _, b in lengths)
    if not lengths:
        return 0, 0
    return min(a for a, _ in lengths), None if any(b is None for _, b in lengths) else max(b for _, b in lengths)


def with_length(t: Translated, min_len: int, max_len: int | None) -> list:
    """The alternatives of `t` cut to strings of min_len..max_len characters. Exact when each
    alternative has at most two variable-length parts, each a repeated single character;
    anything else is refused."""
    out = []
    for node in t.alts:
        lo, hi = char_length(node)
        if lo >= min_len and (max_len is None or (hi is not None and hi <= max_len)):
            out.append(node)
            continue
        if max_len is not None and lo > max_len or (hi is not None and hi < min_len):
            continue  # no string of this alternative has an allowed length
        out.extend(_cut(node, min_len, max_len, t))
    return out


def _flatten_seq(node) -> list:
    if node[0] == "seq":
        return [x for n in node[1] for x in _flatten_seq(n)]
    if node[0] == "alt" and len(node[1]) == 1:
        return _flatten_seq(node[1][0])
    return [node]


def _cut(node, min_len: int, max_len: int | None, t: Translated) -> list:
    items = _flatten_seq(node)
    fixed = 0
    flexible = []
    for k, item in enumerate(items):
        a, b = char_length(item)
        if a == b:
            fixed += a
        elif item[0] == "rep" and char_length(item[1]) == (1, 1):
            flexible.append(k)
        else:
            flexible = None
            break
    why = "combined with minLength/maxLength, only patterns whose variable parts are repeated single characters are supported"
    if flexible is None or len(flexible) > 2:
        raise _refuse(t.param, t.source, why)
    lo_total = max(min_len - fixed, 0)
    hi_total = None if max_len is None else max_len - fixed
    if hi_total is not None and hi_total < 0:
        return []
    if len(flexible) == 1:
        k = flexible[0]
        rep = items[k]
        lo = max(rep[2], lo_total)
        hi = hi_total if rep[3] is None else rep[3] if hi_total is None else min(rep[3], hi_total)
        if hi is not None and hi < lo:
            return []
        return [("seq", items[:k] + [("rep", rep[1], lo, hi)] + items[k + 1 :])]
    # Two variable parts: enumerate the first one's count (bounded, so the regex stays small).
    k1, k2 = flexible
    r1, r2 = items[k1], items[k2]
    top1 = min(x for x in (r1[3], hi_total) if x is not None) if (r1[3], hi_total) != (None, None) else None
    if top1 is None or top1 - r1[2] > 64:
        raise _refuse(t.param, t.source, why + " (and the lengths span at most 64 values)")
    out = []
    for c1 in range(r1[2], top1 + 1):
        lo2 = max(r2[2], lo_total - c1)
        hi2 = None if hi_total is None else hi_total - c1
        hi2 = r2[3] if hi2 is None else hi2 if r2[3] is None else min(r2[3], hi2)
        if hi2 is not None and hi2 < lo2:
            continue
        new = list(items)
        new[k1] = ("rep", r1[1], c1, c1)
        new[k2] = ("rep", r2[1], lo2, hi2)
        out.append(("seq", new))
    return out


# ---------------------------------------------------------------------------------------------
# Emission


def emit(node) -> str | None:
    """The JSON text (between the quotes) of strings matching `node`."""
    kind = node[0]
    if kind == "set":
        return rx.json_chars(rx.intersect(node[1], BMP))
    if kind == "any":
        return rx.JSON_CHAR
    if kind == "seq":
        return rx.seq(*(emit(n) for n in node[1]))
    if kind == "alt":
        return rx.alt(emit(n) for n in node[1])
    return rx.repeat(emit(node[1]), node[2], node[3])
