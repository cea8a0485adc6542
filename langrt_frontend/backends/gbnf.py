"""Regexes as GBNF grammars (llama.cpp's grammar format), for servers that constrain output by
grammar but not by regex (llama.cpp's servers take `grammar`, not `regex`).

The regex is parsed by Python's own `re` parser, so what `re` accepts is read exactly as `re`
reads it; the constructs GBNF cannot say (backreferences, lookarounds, word boundaries, inline
flags, possessive and atomic groups) raise `UnsupportedRegex` naming them. `\\d`, `\\w` and `\\s`
become their ASCII classes: every output of the grammar still matches the regex (whose
Unicode classes hold the ASCII ones), which is what the frontend checks afterwards.
"""

from __future__ import annotations

try:  # Python 3.11+
    from re import _constants as sre, _parser as sre_parse
except ImportError:  # Python 3.10
    import sre_constants as sre  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]


class UnsupportedRegex(ValueError):
    """A regex construct that has no GBNF equivalent."""


_CATEGORIES = {
    sre.CATEGORY_DIGIT: (False, "0-9"),
    sre.CATEGORY_NOT_DIGIT: (True, "0-9"),
    sre.CATEGORY_SPACE: (False, " \\t\\n\\r\\x0B\\x0C"),
    sre.CATEGORY_NOT_SPACE: (True, " \\t\\n\\r\\x0B\\x0C"),
    sre.CATEGORY_WORD: (False, "a-zA-Z0-9_"),
    sre.CATEGORY_NOT_WORD: (True, "a-zA-Z0-9_"),
}
# Anchors at the ends change nothing: a constraint always covers the whole output.
_ENDS = {sre.AT_BEGINNING, sre.AT_BEGINNING_STRING, sre.AT_END, sre.AT_END_STRING}


def regex_to_gbnf(pattern: str, prefix: str = "") -> str:
    """A grammar for `prefix` followed by a full match of `pattern`."""
    tree = sre_parse.parse(pattern)
    if tree.state.flags & ~(sre.SRE_FLAG_UNICODE):
        raise UnsupportedRegex(f"regex flags other than the defaults cannot become GBNF: {pattern!r}")
    body = _sequence(tree)
    return f"root ::= {literal(prefix)} {body}" if prefix else f"root ::= {body}"


def choices_to_gbnf(choices, prefix: str = "") -> str:
    """A grammar for `prefix` followed by exactly one of `choices`."""
    alternatives = " | ".join(literal(c) for c in choices)
    return f"root ::= {literal(prefix)} ({alternatives})" if prefix else f"root ::= ({alternatives})"


def literal(text: str) -> str:
    return '"' + "".join(_char(c) for c in text) + '"'


def _char(c: str) -> str:
    """One character as GBNF writes it, in a string or a class: letters, digits and spaces as
    they are, everything else as a hex escape (so no quoting rule can be missed)."""
    if c.isascii() and (c.isalnum() or c == " "):
        return c
    code = ord(c)
    if code <= 0xFF:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def _sequence(items) -> str:
    parts, run = [], ""
    for op, av in items:
        if op is sre.LITERAL:
            run += chr(av)
            continue
        if run:
            parts.append(literal(run))
            run = ""
        part = _node(op, av)
        if part:
            parts.append(part)
    if run:
        parts.append(literal(run))
    return " ".join(parts) or '""'


def _node(op, av) -> str:
    if op is sre.NOT_LITERAL:
        return f"[^{_char(chr(av))}]"
    if op is sre.ANY:
        return "[^\\x0A]"
    if op is sre.IN:
        return _char_class(av)
    if op is sre.CATEGORY:
        negated, body = _CATEGORIES[av]
        return f"[^{body}]" if negated else f"[{body}]"
    if op is sre.BRANCH:
        return "(" + " | ".join(_sequence(branch) for branch in av[1]) + ")"
    if op is sre.SUBPATTERN:
        _, add_flags, del_flags, inner = av
        if add_flags or del_flags:
            raise UnsupportedRegex("inline regex flags cannot become GBNF")
        return f"({_sequence(inner)})"
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
        low, high, inner = av
        return f"({_sequence(inner)}){_quantifier(low, high)}"
    if op is sre.AT and av in _ENDS:
        return ""
    raise UnsupportedRegex(f"the regex construct {str(op).lower()} cannot become GBNF")


def _quantifier(low: int, high: int) -> str:
    unbounded = high == sre.MAXREPEAT
    if (low, unbounded) == (0, True):
        return "*"
    if (low, unbounded) == (1, True):
        return "+"
    if (low, high) == (0, 1):
        return "?"
    if unbounded:
        return f"{{{low},}}"
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"


def _char_class(items) -> str:
    negated, body = False, ""
    for op, av in items:
        if op is sre.NEGATE:
            negated = True
        elif op is sre.LITERAL:
            body += _char(chr(av))
        elif op is sre.RANGE:
            body += f"{_char(chr(av[0]))}-{_char(chr(av[1]))}"
        elif op is sre.CATEGORY and not _CATEGORIES[av][0]:
            body += _CATEGORIES[av][1]
        elif op is sre.CATEGORY and len(items) == 1:
            return f"[^{_CATEGORIES[av][1]}]"
        else:
            raise UnsupportedRegex(f"the character class item {str(op).lower()} {av!r} cannot become GBNF")
    return f"[^{body}]" if negated else f"[{body}]"
