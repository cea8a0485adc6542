"""Regex building blocks for the JSON-schema compiler.

Every regex written here is in the subset that Python's `re` and Rust's `regex` crate (through
outlines-core) read the same way: groups, alternation, classes, `* + ? {m,n}`, and escapes of
metacharacters only (`\\<` is a word boundary in Rust, so ordinary punctuation is never
escaped). No `\\d \\w \\s` (Unicode-aware, different per engine), no lookaround.

`None` stands for "no text at all" (a schema that admits nothing): `seq` with a `None` part is
`None`, `alt` drops `None` parts, `opt(None)` is the empty string.
"""

from __future__ import annotations

import bisect
import functools
import json
import math

# Plane 16 (U+100000-U+10FFFF) is left out of every class: the byte automaton reserves two of
# its characters as start and end markers (byte_dfa.py) and cannot produce any of them, and a
# class that could read the start marker would make outlines-core's determinisation explode.
MAX_CP = 0xFFFFF
PLANE_16 = "\\U00100000-\\U0010ffff"
SURROGATES = (0xD800, 0xDFFF)

# Metacharacters of either engine outside a class (Rust also reserves # & - ~).
_META = set("\\.^$|?*+()[]{}#&-~")
# Inside a class: Rust's set operators (&& -- ~~) and Python's nested sets: escaped, as both accept.
_CLASS_META = set("\\]^-[&~|")

HEX = "[0-9a-fA-F]"

# One JSON string character, as its raw form or any escape. Each alternative decodes to exactly
# one code point (so `{m,n}` counts characters as JSON Schema does): lone-surrogate escapes are
# excluded (a \\uD83D\\uDE00 pair decodes to ONE character and is its own alternative).
_RAW_CHAR = f'[^"\\\\\\x00-\\x1f{PLANE_16}]'
_U_ESCAPE = "\\\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD](?:[0-7][0-9a-fA-F]{2}|[89abAB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F][0-9a-fA-F]{2}))"
JSON_CHAR = f'(?:{_RAW_CHAR}|\\\\["\\\\/bfnrt]|{_U_ESCAPE})'
JSON_STRING = f'"{JSON_CHAR}*"'
INTEGER = "-?(?:0|[1-9][0-9]*)"
NUMBER = "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"


# ---------------------------------------------------------------------------------------------
# Combinators


# Why 256: finding whether a regex is already one group scans it in Python; past this length
# wrapping it once more (4 characters, no state) is cheaper than the scan.
_GROUP_SCAN_MAX = 256


def group(r: str) -> str:
    """`r` as one unit a quantifier can follow."""
    if len(r) == 1 or (len(r) == 2 and r[0] == "\\") or (len(r) <= _GROUP_SCAN_MAX and _is_group(r)):
        return r
    return f"(?:{r})"


@functools.lru_cache(maxsize=8192)  # schemas wrap the same pieces (a value, a key) again and again
def _is_group(r: str) -> bool:
    if not (r.startswith("(?:") and r.endswith(")")) and not (r.startswith("[") and r.endswith("]")):
        return False
    depth = 0
    in_class = False
    i = 0
    while i < len(r):
        c = r[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if depth == 0 and not in_class and i < len(r) - 1:
            return False
        i += 1
    return True


def seq(*parts: str | None) -> str | None:
    if any(p is None for p in parts):
        return None
    return "".join(parts)


def alt(parts) -> str | None:
    uniq: list[str] = []
    for p in parts:
        if p is not None and p not in uniq:
            uniq.append(p)
    if not uniq:
        return None
    if "" in uniq and len(uniq) > 1:
        return opt(alt(p for p in uniq if p))
    if len(uniq) == 1:
        return uniq[0]
    return "(?:" + "|".join(uniq) + ")"


def opt(r: str | None) -> str:
    if not r:
        return ""
    return group(r) + "?"


def repeat(r: str | None, lo: int, hi: int | None) -> str | None:
    """`r` repeated lo..hi times (hi None: unbounded)."""
    if hi is not None and hi < lo:
        return None
    if r is None:
        return "" if lo == 0 else None
    if r == "" or hi == 0:
        return ""
    g = group(r)
    if (lo, hi) == (1, 1):
        return r
    if hi is None:
        return g + ("*" if lo == 0 else "+" if lo == 1 else "{%d,}" % lo)
    if (lo, hi) == (0, 1):
        return g + "?"
    if lo == hi:
        return g + "{%d}" % lo
    return g + "{%d,%d}" % (lo, hi)


# ---------------------------------------------------------------------------------------------
# Literals and character classes


def _char_escape(cp: int) -> str:
    if cp < 0x20 or cp == 0x7F:
        return "\\x%02x" % cp
    c = chr(cp)
    if cp >= 0x80 and not c.isprintable():
        return "\\u%04x" % cp if cp <= 0xFFFF else "\\U%08x" % cp
    return c


def escape(text: str) -> str:
    """`text` as a regex matching exactly it, in both engines."""
    return "".join("\\" + c if c in _META else _char_escape(ord(c)) for c in text)


def char_class(ranges: list[tuple[int, int]]) -> str | None:
    """A class matching the code points in `ranges` (sorted, disjoint, no surrogates)."""
    return _char_class(tuple(map(tuple, ranges)))


@functools.lru_cache(maxsize=4096)  # schemas repeat the same few classes (string characters, digits)
def _char_class(ranges: tuple[tuple[int, int], ...]) -> str | None:
    if not ranges:
        return None
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return escape(chr(ranges[0][0]))
    comp = complement(ranges)
    negate = len(comp) < len(ranges) and ranges[-1][1] == MAX_CP
    body = "".join(_class_range(a, b) for a, b in (comp if negate else ranges) if not _is_surrogates(a, b))
    if negate:
        body += PLANE_16
    return ("[^" if negate else "[") + body + "]"


def _is_surrogates(a: int, b: int) -> bool:
    return (a, b) == SURROGATES


def _class_range(a: int, b: int) -> str:
    one = lambda cp: "\\" + chr(cp) if chr(cp) in _CLASS_META else _char_escape(cp)  # noqa: E731
    if a == b:
        return one(a)
    if b == a + 1:
        return one(a) + one(b)
    return one(a) + "-" + one(b)


def normalize(ranges) -> list[tuple[int, int]]:
    """Sort and merge code point ranges, dropping surrogates (no engine can match those) and
    plane 16 (above MAX_CP)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        b = min(b, MAX_CP)
        for lo, hi in ((a, min(b, SURROGATES[0] - 1)), (max(a, SURROGATES[1] + 1), b)):
            if lo > hi:
                continue
            if out and lo <= out[-1][1] + 1:
                out[-1] = (out[-1][0], max(out[-1][1], hi))
            else:
                out.append((lo, hi))
    return out


def complement(ranges) -> list[tuple[int, int]]:
    out, nxt = [], 0
    for a, b in normalize(ranges):
        if a > nxt:
            out.append((nxt, a - 1))
        nxt = b + 1
    if nxt <= MAX_CP:
        out.append((nxt, MAX_CP))
    return normalize(out)


def without(ranges, points) -> list[tuple[int, int]]:
    """Normalized `ranges` less the code points `points` (one pass, no complements)."""
    out, cut = [], sorted(set(points))
    for a, b in ranges:
        for p in cut[bisect.bisect_left(cut, a) : bisect.bisect_right(cut, b)]:
            if p > a:
                out.append((a, p - 1))
            a = p + 1
        if a <= b:
            out.append((a, b))
    return out


def intersect(a, b) -> list[tuple[int, int]]:
    return complement(normalize(complement(a) + complement(b)))


def json_chars(ranges) -> str | None:
    """One JSON string character whose DECODED code point is in `ranges`: raw where JSON allows
    it raw, else its escapes. (Characters that may also be written as \\uXXXX are accepted raw
    only: a subset, which is sound.)"""
    return _json_chars(tuple(normalize(ranges)))


@functools.lru_cache(maxsize=4096)
def _json_chars(ranges: tuple[tuple[int, int], ...]) -> str | None:
    raw = intersect(ranges, [(0x20, 0x21), (0x23, 0x5B), (0x5D, MAX_CP)])
    parts = [char_class(raw)] if raw else []
    for a, b in ranges:
        for cp in range(a, min(b, 0x5C) + 1):
            if cp < 0x20 or cp in (0x22, 0x5C):
                parts.append(_escaped_char(cp))
    return alt(parts)


_SHORT_ESCAPES = {
    0x22: '\\\\"',
    0x5C: "\\\\\\\\",
    0x08: "\\\\b",
    0x0C: "\\\\f",
    0x0A: "\\\\n",
    0x0D: "\\\\r",
    0x09: "\\\\t",
}


def _hex_ci(digits: str) -> str:
    """Hex digits matched case-insensitively."""
    return "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in digits)


def _escaped_char(cp: int) -> str:
    """A character written as a JSON escape: its short form (if any) or \\uXXXX."""
    forms = [_SHORT_ESCAPES[cp]] if cp in _SHORT_ESCAPES else []
    forms.append("\\\\u" + _hex_ci("%04x" % cp))
    return alt(forms)


def string_char_literal(c: str) -> str:
    """One decoded character as JSON text: raw, or escaped as json.dumps does by default."""
    cp = ord(c)
    if cp < 0x20 or cp in (0x22, 0x5C):
        return _escaped_char(cp)
    if cp < 0x80:
        return escape(c)
    if cp <= 0xFFFF:
        return alt([escape(c), "\\\\u" + _hex_ci("%04x" % cp)])
    hi, lo = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
    return alt([escape(c), "\\\\u" + _hex_ci("%04x" % hi) + "\\\\u" + _hex_ci("%04x" % lo)])


def string_literal(s: str) -> str | None:
    """The JSON texts of `s`; None if `s` holds a lone surrogate (no UTF-8 text decodes to it,
    and its escape next to another one would decode as a pair)."""
    if any(SURROGATES[0] <= ord(c) <= SURROGATES[1] for c in s):
        return None
    return '"' + "".join(string_char_literal(c) for c in s) + '"'


def number_literal(v) -> str:
    """JSON numbers equal to `v`: its json.dumps text, and the other form of an integral value
    (`1` for 1.0, `1.0` for 1) while floats represent it exactly."""
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{v!r} is not a JSON number")
    exact = float(v).is_integer() and abs(v) <= 2**53
    if not exact:
        return escape(json.dumps(v))
    return escape(str(int(v))) + "(?:\\.0+)?"


# ---------------------------------------------------------------------------------------------
# Numeric ranges as digit-by-digit regexes


# (JSON escape as regex, the character it stands for)
SIMPLE_ESCAPES = [
    (r'\\"', '"'),
    (r"\\\\", "\\"),
    (r"\\/", "/"),
    (r"\\b", "\b"),
    (r"\\f", "\f"),
    (r"\\n", "\n"),
    (r"\\r", "\r"),
    (r"\\t", "\t"),
]
