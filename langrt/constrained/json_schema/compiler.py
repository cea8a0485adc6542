"""schema_to_regex: each flat schema (normalize.py) as regex text, type by type, under the limits
below (the automaton and token masks built from a regex grow with it).
"""

from __future__ import annotations

import json
import re

from langrt.constrained.byte_dfa import call_marker
from langrt.constrained.json_schema import regex as rx
from langrt.constrained.json_schema.flat import Flat, Node, check_pending, json_equal, json_type
from langrt.constrained.json_schema.keys import key_not_in
from langrt.constrained.json_schema.literals import compact_texts, pinned_values, valid_values
from langrt.constrained.json_schema.normalize import Normalizer
from langrt.constrained.json_schema.numeric import number_regex
from langrt.constrained.json_schema.objects import ObjectMixin
from langrt.constrained.json_schema.strings import StringMixin
from langrt.constrained.json_schema.rules import RuleBook, calls_any
from langrt.constrained.dfa_product import intersection_body
from langrt.errors import InvalidRequest, UnsupportedSchema

WHITESPACE_POLICIES = ("compact", "flexible")
# Why 3: a recursive $ref is unrolled into the regex once per level, so its size grows with
# the depth (geometrically for trees: a node with two recursive children doubles per level);
# 3 levels keep typical recursive schemas (trees, linked lists, nested comments) well under
# max_regex_length. Instances nested deeper are rejected, which is sound.
DEFAULT_MAX_REF_DEPTH = 3
# Why 100k: the byte automaton outlines-core builds, and the token masks computed for each of
# its states, grow with the regex; schemas past this are pathological (and the runtime's own
# regex limit is 200k).
DEFAULT_MAX_REGEX_LENGTH = 100_000
# Why 20: "flexible" whitespace must be bounded (a model can emit spaces forever); 20 covers
# json.dumps(indent=2) output nested 9 levels deep (a newline and 2 spaces per level).
FLEXIBLE_WS_MAX = 20
# Why 3: values a schema leaves free (`true`, absent `items`, a `required` name without a
# schema) may be any JSON; the regex for "any value" grows 4x per nesting level: at 3 (what
# OpenAI's json_object mode needs for ordinary nested answers) ~15k characters, an automaton of
# ~2.4k states built in ~60 ms; at 4, 59k characters and ~270 ms.
ANY_VALUE_DEPTH = 3
# Why 64: anyOf inside allOf (or oneOf) multiplies out into alternatives, each a full regex.
MAX_DISJUNCTS = 64


def schema_to_regex(
    schema: dict | bool | str,
    whitespace: str = "compact",
    max_ref_depth: int = DEFAULT_MAX_REF_DEPTH,
    max_regex_length: int = DEFAULT_MAX_REGEX_LENGTH,
) -> str:
    """A regex whose full matches are JSON texts valid against `schema` (a dict, a bool, or
    its JSON text). whitespace: "compact" (none outside strings but one optional space after
    ':' and ','), or "flexible" (up to FLEXIBLE_WS_MAX JSON whitespace characters between
    tokens). Raises InvalidRequest (param "json_schema" / "whitespace") for bad input and
    UnsupportedSchema (param: the keyword, or "json_schema" for limits) for what it cannot
    enforce."""
    schema = _checked(schema, whitespace)
    compiler = _Compiler(schema, whitespace, max_ref_depth, max_regex_length)
    return compiler.root_value()


def schema_to_grammar(
    schema: dict | bool | str,
    whitespace: str = "compact",
    max_regex_length: int = DEFAULT_MAX_REGEX_LENGTH,
    open_objects: bool = False,
    any_order: bool = False,
):
    """What schema_to_regex gives, as grammar rules (a cfg.rules.RuleSet) where the schema
    recurses or is big: recursion is unbounded and values left free nest to any depth; a
    schema that needs neither stays one regex (a str). open_objects: where a schema does not
    say additionalProperties, other properties (any value) may come before, between and after
    the listed ones, as JSON Schema allows (default: only the listed ones, as xgrammar's strict
    mode and SGLang do). any_order: an object's properties may come in any order (default: the
    schema's order, as xgrammar and SGLang write them); see objects.py."""
    schema = _checked(schema, whitespace)
    book = RuleBook()
    compiler = _Compiler(schema, whitespace, DEFAULT_MAX_REF_DEPTH, max_regex_length, book)
    compiler.open_objects = compiler.norm.open_objects = open_objects
    compiler.any_order = any_order
    return book.rule_set(compiler.root_value())


def _checked(schema, whitespace: str):
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise InvalidRequest(f"json_schema is not valid JSON: {e}", param="json_schema") from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest("json_schema must be a JSON object or a boolean", param="json_schema")
    if whitespace not in WHITESPACE_POLICIES:
        raise InvalidRequest(
            f"whitespace must be one of {', '.join(WHITESPACE_POLICIES)}, got {whitespace!r}", param="whitespace"
        )
    if schema is False:
        raise UnsupportedSchema(
            "the schema is false: no value is valid, there is nothing to generate", param="json_schema"
        )
    return schema


class _Compiler(ObjectMixin, StringMixin):
    def __init__(self, root, whitespace: str, max_ref_depth: int, max_regex_length: int, book: RuleBook | None = None):
        self.root, self.whitespace, self.book = root, whitespace, book
        self.open_objects = self.any_order = False
        self.max_ref_depth, self.max_len = max_ref_depth, max_regex_length
        self.norm = Normalizer(root, max_ref_depth, MAX_DISJUNCTS)
        compact = whitespace == "compact"
        self.ws = "" if compact else "[ \\t\\n\\r]{0,%d}" % FLEXIBLE_WS_MAX
        self.colon = ": ?" if compact else f"{self.ws}:{self.ws}"
        self.comma = ", ?" if compact else f"{self.ws},{self.ws}"
        self.memo: dict = {}
        self._any: dict = {}
        self._checker: _Compiler | None = None

    def root_value(self) -> str:
        regex = self.value([Node(self.root, self.root)], ())
        if regex is None:
            hint = (
                f" (recursion through $ref stops at max_ref_depth={self.max_ref_depth})" if self.norm.depth_hit else ""
            )
            raise UnsupportedSchema(f"the schema admits no value langrt can generate{hint}", param="json_schema")
        return regex

    def value(self, nodes, refs: tuple) -> str | None:
        """A JSON value valid against every schema of `nodes`; None if there is none. With
        rules, a value position starts afresh (refs ()): recursion is met as a value already
        being written, and becomes a call to its rule."""
        if self.book is not None:
            return self._rule_value(nodes)
        key = (tuple(n.key for n in nodes), refs)
        if key not in self.memo:
            self.memo[key] = self._limit(self._values(nodes, refs))
        return self.memo[key]

    def _values(self, nodes, refs: tuple) -> str | None:
        """The values of `nodes`, type by type; where the keywords cannot be written or admit
        nothing here but the schema pins its values, the pinned values jsonschema accepts."""
        try:
            regex = rx.alt(self.flat(f) for f in self.norm.flatten(nodes, refs))
        except UnsupportedSchema:
            if pinned_values(nodes) is None:
                raise
            regex = None
        values = pinned_values(nodes) if regex is None else None
        return regex if values is None else rx.alt(self.literal(v) for v in valid_values(values, nodes))

    def value_call(self, nodes, refs: tuple) -> str | None:
        """value(), as a call to its rule (rules only): for values copied many times."""
        regex = self.value(nodes, refs)
        if regex is None or len(regex) <= len(call_marker(0)):
            return regex
        key = tuple(n.key for n in nodes)
        self.memo[key] = marker = self.book.call(key)
        self.book.bodies[self.book.ids[key]] = regex
        return marker

    def _rule_value(self, nodes) -> str | None:
        key = tuple(n.key for n in nodes)
        if key in self.memo:
            return self.memo[key]
        if key in self.book.active:
            return self.book.call(key)
        self.book.active.add(key)
        try:
            regex = self._limit(self._values(nodes, ()))
        finally:
            self.book.active.discard(key)
        self.memo[key] = found = self.book.settle(key, regex)
        return found

    def _limit(self, regex: str | None) -> str | None:
        if regex is not None and len(regex) > self.max_len:
            raise UnsupportedSchema(
                f"the schema's regex exceeds max_regex_length={self.max_len} characters (a big automaton "
                "and costly token masks): simplify the schema (fewer alternatives, shallower recursion)",
                param="json_schema",
            )
        return regex

    def flat(self, f: Flat) -> str | None:
        f, strings, bools = self._exclusions(f)
        if f.enum is not None:
            return self.enum(f)
        t = f.types
        parts = [
            "null" if "null" in t else None,
            rx.alt(b for b in ("true", "false") if (b == "true") not in bools) if "boolean" in t else None,
            self.number(f) if t & {"integer", "number"} else None,
            (self.string(f) if not strings else self._string_not_in(f, strings)) if "string" in t else None,
            self.array(f) if "array" in t else None,
            self.object(f) if "object" in t else None,
        ]
        return rx.alt(parts)

    def _exclusions(self, f: Flat) -> tuple[Flat, list, set]:
        """`f` without its excluded values (`not` of const/enum): enums filtered, null dropped;
        and the strings and booleans still to leave out. An excluded number, array or object
        that `f` could generate is refused."""
        if not f.excluded:
            return f, [], set()
        g = f.clone()
        g.excluded = []
        if g.enum is not None:
            g.enum = [v for v in g.enum if not any(json_equal(v, x) for x in f.excluded)]
            return g, [], set()
        strings, bools = [], set()
        for v in f.excluded:
            t = json_type(v)
            if self.norm.rejects(g, v):
                continue
            if t == "null":
                g.types.discard("null")
            elif t in ("boolean", "string"):
                (bools.add if t == "boolean" else strings.append)(v)
            else:
                raise UnsupportedSchema(
                    f"'{f.excluded_by}' excludes the {t} {json.dumps(v)[:40]}: leaving out one {t} is not supported",
                    param=f.excluded_by,
                )
        return g, strings, bools

    def _string_not_in(self, f: Flat, strings: list) -> str | None:
        # Raw strings other than the excluded ones, or strings with an escape of a character no
        # excluded one holds (so they cannot decode to one of them).
        held = set("".join(s for s in strings if isinstance(s, str)))
        escapes = rx.alt(e for e, c in rx.SIMPLE_ESCAPES if c not in held)
        escaped = None if escapes is None else f'"{rx.JSON_CHAR}*{escapes}{rx.JSON_CHAR}*"'
        others = rx.alt([key_not_in(strings), escaped])
        if not (f.patterns or f.formats or f.min_length or f.max_length is not None):
            return others
        string = self.string(f)  # with pattern, format or lengths: both automata at once
        if string is None:
            return None
        if self.book is None or calls_any(string):
            raise UnsupportedSchema(
                f"'{f.excluded_by}' excludes strings of a string with pattern, format or lengths", param=f.excluded_by
            )
        return self.book.rule_for(
            intersection_body(
                [string, others], why=f"'{f.excluded_by}' excluding strings of a string with pattern, format or lengths"
            )
        )

    # -- literals (const, enum) -------------------------------------------------------------

    def enum(self, f: Flat) -> str | None:
        """The enum values that also satisfy the schema's other keywords. A value is kept when
        its compact JSON text matches the regex of those keywords (so it is valid)."""
        rest = f.clone()
        rest.enum = None
        rest.types &= {json_type(v) for v in f.enum}
        blank = Flat(refs=f.refs)
        blank.types = set(rest.types)
        check = None
        if rest != blank:
            check = self.checker().flat(rest)
            if check is None:
                return None
        kept = []
        for v in f.enum:
            if json_type(v) not in rest.types:
                continue
            if check is None or any(re.fullmatch(check, text) for text in compact_texts(v)):
                kept.append(self.literal(v))
        return rx.alt(kept)

    def checker(self) -> "_Compiler":
        """A one-regex compiler (compact whitespace, no rules) whose regexes Python's re runs:
        literals in the schema are checked against them (a match is valid)."""
        if self._checker is None:
            self._checker = _Compiler(self.root, "compact", self.max_ref_depth, self.max_len)
            self._checker.norm = self.norm
        return self._checker

    def fits(self, nodes, refs: tuple, v) -> bool:
        """`v` is proved valid against every schema of `nodes` (False: not proved)."""
        check = self.checker().value(nodes, refs)
        return check is not None and any(re.fullmatch(check, text) for text in compact_texts(v))

    def literal(self, v) -> str | None:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return rx.number_literal(v)
        if isinstance(v, str):
            return rx.string_literal(v)
        if isinstance(v, list):
            open_, close = "\\[", "\\]"
            parts = [self.literal(x) for x in v]
        else:
            open_, close = "\\{", "\\}"
            parts = [rx.seq(rx.string_literal(k), self.colon, self.literal(x)) for k, x in v.items()]
        if not parts:
            return self.container(open_, close, None, optional=True)
        return None if None in parts else self.container(open_, close, self.comma.join(parts), optional=False)

    def container(self, open_: str, close: str, body: str | None, optional: bool) -> str | None:
        """open_ body close, body optional or required; whitespace policy applied."""
        if body is None:
            return f"{open_}{self.ws}{close}" if optional else None
        inner = body + self.ws
        return open_ + self.ws + (rx.opt(inner) if optional else inner) + close

    # -- scalars ----------------------------------------------------------------------------

    def number(self, f: Flat) -> str | None:
        return number_regex(f)

    # -- containers -------------------------------------------------------------------------

    def any(self, depth: int) -> str:
        """Any JSON value with at most `depth` nested containers (with rules: any depth)."""
        if self.book is not None:
            return self._any_rule()
        if depth not in self._any:
            scalars = f"(?:null|true|false|{rx.NUMBER}|{rx.JSON_STRING})"
            if depth <= 0:
                self._any[depth] = scalars
            else:
                inner = self.any(depth - 1)
                array = self.container("\\[", "\\]", inner + rx.repeat(self.comma + inner, 0, None), optional=True)
                kv = rx.JSON_STRING + self.colon + inner
                obj = self.container("\\{", "\\}", kv + rx.repeat(self.comma + kv, 0, None), optional=True)
                self._any[depth] = rx.alt([scalars, array, obj])
        return self._any[depth]

    def any_value(self) -> str:
        """A value a schema leaves free."""
        return self.any(ANY_VALUE_DEPTH - 1)

    def _any_rule(self) -> str:
        key = ("any",)
        if key not in self.book.ids:
            inner = self.book.call(key)
            scalars = f"(?:null|true|false|{rx.NUMBER}|{rx.JSON_STRING})"
            array = self.container("\\[", "\\]", inner + rx.repeat(self.comma + inner, 0, None), optional=True)
            kv = rx.JSON_STRING + self.colon + inner
            obj = self.container("\\{", "\\}", kv + rx.repeat(self.comma + kv, 0, None), optional=True)
            self.book.bodies[self.book.ids[key]] = rx.alt([scalars, array, obj])
        return self.book.call(key)

    def array(self, f: Flat) -> str | None:
        check_pending(f, "array")
        lo, hi = f.min_items, f.max_items
        elems = []
        for nodes in f.prefix:
            if hi is not None and len(elems) >= hi:
                break
            r = self.value(nodes, f.refs)
            if r is None:  # no value fits this position: arrays end before it
                hi = len(elems) if hi is None else min(hi, len(elems))
                break
            elems.append(r)
        tail = None
        if hi is None or hi > len(elems):
            if len(elems) == len(f.prefix):
                tail = self.value(f.items, f.refs) if f.items is not None else self.any_value()
            if tail is None:
                hi = len(elems)
        if hi is not None and lo > hi:
            return None
        if f.unique_items and (hi is None or hi > 1):
            raise UnsupportedSchema("'uniqueItems': true is not supported (unless maxItems <= 1)", param="uniqueItems")
        if hi == 0:
            return self.container("\\[", "\\]", None, optional=True)
        # Nested from the end: element i is followed by the rest, optional once lo are present.
        count = len(elems)
        if tail is not None:
            more_lo = max(lo - count, 0)
            more_hi = None if hi is None else hi - count
            if count == 0:
                rest = tail + rx.repeat(
                    self.comma + tail, max(more_lo - 1, 0), None if more_hi is None else more_hi - 1
                )
            else:
                rest = rx.repeat(self.comma + tail, more_lo, more_hi)
        else:
            rest = ""
        for i in range(count - 1, -1, -1):
            head = elems[i] if i == 0 else self.comma + elems[i]
            rest = head + (rest if i + 1 < lo else rx.opt(rest))
        return self.container("\\[", "\\]", rest, optional=lo == 0)
