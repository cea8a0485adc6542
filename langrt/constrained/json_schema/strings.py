"""Strings for the JSON-schema compiler (a mixin of compiler._Compiler): `pattern`, `format` and
the length keywords.

One pattern or format, cut to length where the regex rewrite can (pattern.with_length), stays
regex text. What a regex cannot write small becomes a rule whose automaton is built by
intersection (dfa_product.py): several patterns/formats together, a pattern with a length the
rewrite refuses, and strings of more than COUNTED_RULE_MIN characters, which are counted
rather than spelled out. Past CHUNKED_MIN characters even a counted automaton is too big (~23
states per character), so the string is a run of rules of CHUNK characters each, then a
shorter tail: the rule's stack does the counting.
"""

from __future__ import annotations

from langrt.constrained.dfa_product import intersection_body
from langrt.constrained.json_schema import regex as rx
from langrt.constrained.json_schema.flat import Flat
from langrt.constrained.json_schema.formats import FORMATS, format_pattern
from langrt.constrained.json_schema.pattern import emit, translate, with_length
from langrt.errors import UnsupportedSchema

# Why 64: a string of at most n characters is ~23 automaton states per character; past 64 it is
# one rule (built by counting, ~5x faster than the regex's automaton) shared by every place
# that uses it, not a copy in each.
COUNTED_RULE_MIN = 64
# Why 1,024 and 256: a counted string of 1,024 characters is ~24k states (~0.1 s, 24 MB of
# table); chunks of 256 keep each chunk's automaton at ~6k states, and the run of chunks for
# the longest strings seen in schemas (65,535) at 256 calls.
CHUNKED_MIN = 1_024
CHUNK = 256


class StringMixin:
    def string(self, f: Flat) -> str | None:
        formats = [x for x in dict.fromkeys(f.formats) if x in FORMATS]  # others are annotations
        specs = [("pattern", p) for p in dict.fromkeys(f.patterns)] + [("format", x) for x in formats]
        if not specs:
            return self._any_string(f.min_length, f.max_length)
        translated = [translate(s) if kind == "pattern" else format_pattern(s) for kind, s in specs]
        try:
            if len(specs) > 1:
                raise UnsupportedSchema(
                    f"a string with several patterns/formats ({', '.join(repr(s) for _, s in specs)}): their "
                    f"intersection cannot be written as one regex",
                    param=specs[1][0],
                )
            alts = with_length(translated[0], f.min_length, f.max_length)
            return rx.seq('"', rx.alt(emit(a) for a in alts), '"')
        except UnsupportedSchema:
            if self.book is None:
                raise
        regexes = [rx.alt(emit(a) for a in t.alts) for t in translated]
        if None in regexes:
            return None
        why = _keywords([kind for kind, _ in specs], f.min_length, f.max_length)
        return rx.seq('"', self.book.rule_for(intersection_body(regexes, f.min_length, f.max_length, why)), '"')

    def _any_string(self, lo: int, hi: int | None) -> str:
        if self.book is None or hi is None or hi <= COUNTED_RULE_MIN:
            return rx.seq('"', rx.repeat(rx.JSON_CHAR, lo, hi), '"')
        if hi <= CHUNKED_MIN:
            return rx.seq('"', self._counted(lo, hi), '"')
        return rx.seq('"', self.book.rule_for(self._chunked(lo, hi)), '"')

    def _counted(self, lo: int, hi: int) -> str:
        """A call to the rule of JSON string text of lo..hi characters."""
        return self.book.rule_for(intersection_body([rx.repeat(rx.JSON_CHAR, 0, None)], lo, hi, _keywords([], lo, hi)))

    def _chunked(self, lo: int, hi: int) -> str:
        """JSON string text of lo..hi characters as `a` chunks of CHUNK characters and a tail
        shorter than a chunk (so each length has one reading): runs of `a` that take the same
        tail lengths are one alternative."""
        chunk = self._counted(CHUNK, CHUNK)
        groups: list[list] = []  # [first a, last a, tail lo, tail hi]
        for a in range(hi // CHUNK + 1):
            tail = (max(lo - a * CHUNK, 0), min(CHUNK - 1, hi - a * CHUNK))
            if tail[0] > tail[1]:
                continue
            if groups and groups[-1][1] == a - 1 and tuple(groups[-1][2:]) == tail:
                groups[-1][1] = a
            else:
                groups.append([a, a, *tail])
        return rx.alt(
            rx.seq(rx.repeat(chunk, a, b), self._counted(t_lo, t_hi) if t_hi > 0 else "") for a, b, t_lo, t_hi in groups
        )


def _keywords(kinds: list[str], lo: int, hi: int | None) -> str:
    """The keywords of a string whose automaton is built by intersection, as its refusal names
    them: "'pattern' with 'format' and 'maxLength' 300"."""
    named = (
        [f"'{k}'" for k in dict.fromkeys(kinds)]
        + ([f"'minLength' {lo}"] if lo else [])
        + ([f"'maxLength' {hi}"] if hi is not None else [])
    )
    return "the string's " + " with ".join(named) if named else "the string"
