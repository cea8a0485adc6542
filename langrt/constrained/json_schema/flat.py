"""Schemas as `Flat`s, for the JSON-schema compiler: one conjunction of assertion keywords,
merged exactly keyword by keyword (so `allOf` needs no regex intersection). Subschemas
(properties, items, ...) stay unexpanded as lists of `Node`s (conjunctions), flattened when
their turn comes (normalize.py). A keyword langrt cannot enforce raises UnsupportedSchema naming
it, at once, or (`uniqueItems`, `patternProperties`, ...) only when an instance of the type it
applies to can be generated (`pending`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from langrt.errors import UnsupportedSchema

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
# Keywords that exist only in the complements negate.py writes (tuples: no JSON key spells them).
FORBID = ("langrt", "forbid")  # property names an object must not have
EXCLUDE = ("langrt", "exclude")  # values the instance must not be

# Keywords no regex here enforces, refused wherever they appear...
REFUSED = {
    "$dynamicRef": "dynamic references are not supported",
    "$recursiveRef": "recursive references (draft 2019-09) are not supported",
}
# ...and ones refused only when a value of their type could be generated. A value listed is
# the keyword's no-op form, accepted.
PENDING = {
    "object": {"unevaluatedProperties": True},
    "array": {"contains": None, "minContains": None, "maxContains": None, "unevaluatedItems": True},
}
_PENDING_TYPE = {k: t for t, ks in PENDING.items() for k in ks}


@dataclass(frozen=True)
class Node:
    """A schema and the resource its "#..." references resolve against."""

    schema: Any
    base: Any

    @property
    def key(self) -> tuple[int, int]:
        return id(self.schema), id(self.base)


@dataclass
class Flat:
    """One conjunction of keywords (no combinators, no $ref). Absent keywords: None / empty."""

    types: set = field(default_factory=lambda: set(TYPES))
    enum: list | None = None
    lower: list = field(default_factory=list)  # (value, exclusive)
    upper: list = field(default_factory=list)
    multiple_of: list = field(default_factory=list)
    min_length: int = 0
    max_length: int | None = None
    patterns: list = field(default_factory=list)
    formats: list = field(default_factory=list)
    prefix: list = field(default_factory=list)  # list[list[Node]]
    items: list | None = None  # list[Node]; None: any value
    min_items: int = 0
    max_items: int | None = None
    unique_items: bool = False
    props: dict = field(default_factory=dict)  # name -> list[Node]
    additional: list | None = None  # list[Node]; None: absent
    required: list = field(default_factory=list)
    min_props: int = 0
    max_props: int | None = None
    object_keywords: bool = False  # properties / required / additionalProperties seen
    pattern_props: list = field(default_factory=list)  # (pattern, list[Node])
    property_names: list = field(default_factory=list)  # list[Node]: schemas every key satisfies
    forbidden: list = field(default_factory=list)  # property names an object must not have
    excluded: list = field(default_factory=list)  # values the instance must not be
    excluded_by: str = ""  # the keyword that excluded them (`not`, `if`)
    pending: dict = field(default_factory=dict)  # type -> (keyword, message)
    refs: tuple = ()  # $ref targets inlined on the way here (the recursion depth)

    def clone(self) -> "Flat":
        new = copy.copy(self)
        for name in (
            "types",
            "lower",
            "upper",
            "multiple_of",
            "patterns",
            "formats",
            "required",
            "forbidden",
            "excluded",
        ):
            setattr(new, name, list(getattr(self, name)) if name != "types" else set(self.types))
        new.prefix = [list(p) for p in self.prefix]
        new.props = {k: list(v) for k, v in self.props.items()}
        new.pattern_props = [(p, list(v)) for p, v in self.pattern_props]
        new.property_names = list(self.property_names)
        new.pending = dict(self.pending)
        return new


def check_pending(f: Flat, kind: str) -> None:
    """Refuse a PENDING keyword now that a value of its type is being generated."""
    if kind in f.pending:
        keyword, message = f.pending[kind]
        raise UnsupportedSchema(message, param=keyword)


def json_equal(a, b) -> bool:
    """Equality as JSON Schema defines it (1 == 1.0, true != 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(v)]


def _bad(keyword: str, expected: str) -> UnsupportedSchema:
    return UnsupportedSchema(f"invalid schema: '{keyword}' must be {expected}", param=keyword)


def _count(schema: dict, key: str) -> int:
    v = schema[key]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _bad(key, "a non-negative integer")
    return v


def _number(schema: dict, key: str):
    v = schema[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise _bad(key, "a number")
    return v


def _subschema(value, key: str):
    if not isinstance(value, (dict, bool)):
        raise _bad(key, "a schema (an object or a boolean)")
    return value


def _list(s: dict, key: str) -> list:
    if key not in s:
        return []
    v = s[key]
    if not isinstance(v, list) or not v:
        raise _bad(key, "a non-empty array of schemas")
    return v


def _satisfiable(f: Flat) -> bool:
    """False when no value fits `f`'s own keywords (values of its properties unchecked). An
    object both requiring and forbidding a name is no object: "object" leaves the types."""
    if "object" in f.types and (
        set(f.required) & set(f.forbidden) or f.max_props is not None and f.min_props > f.max_props
    ):
        f.types.discard("object")
    if not f.types or (f.enum is not None and not f.enum):
        return False
    return True


def _apply_keywords(f: Flat, s: dict, base) -> None:
    """Merge the assertion keywords of `s` (not $ref / combinators) into `f`, exactly."""
    _apply_type_and_values(f, s)
    _apply_numbers(f, s)
    _apply_strings(f, s)
    _apply_array_counts(f, s)
    _apply_object_counts(f, s)
    _apply_items(f, s, base)
    _apply_properties(f, s, base)
    _apply_pending(f, s)


def _apply_type_and_values(f: Flat, s: dict) -> None:
    """type, const, enum."""
    if "type" in s:
        t = s["type"]
        names = [t] if isinstance(t, str) else t
        if not isinstance(names, list) or not names or any(n not in TYPES for n in names):
            raise _bad("type", f"one of {', '.join(TYPES)} or a non-empty array of them")
        allowed = set(names) | ({"integer"} if "number" in names else set())
        f.types &= allowed
    for key in ("const", "enum"):
        if key in s:
            values = [s[key]] if key == "const" else s[key]
            if not isinstance(values, list):
                raise _bad("enum", "an array")
            f.enum = list(values) if f.enum is None else [v for v in f.enum if any(json_equal(v, w) for w in values)]
    if EXCLUDE in s:
        f.excluded += s[EXCLUDE]["values"]
        f.excluded_by = f.excluded_by or s[EXCLUDE]["keyword"]
    f.forbidden += [n for n in s.get(FORBID, []) if n not in f.forbidden]


def _apply_numbers(f: Flat, s: dict) -> None:
    """The bounds (minimum, exclusiveMinimum, maximum, exclusiveMaximum) and multipleOf."""
    for key, dest, ex in (
        ("minimum", f.lower, False),
        ("exclusiveMinimum", f.lower, True),
        ("maximum", f.upper, False),
        ("exclusiveMaximum", f.upper, True),
    ):
        if key in s:
            dest.append((_number(s, key), ex))
    if "multipleOf" in s:
        m = _number(s, "multipleOf")
        if m <= 0:
            raise _bad("multipleOf", "a number > 0")
        f.multiple_of.append(m)


def _apply_strings(f: Flat, s: dict) -> None:
    """minLength, maxLength, pattern, format."""
    if "minLength" in s:
        f.min_length = max(f.min_length, _count(s, "minLength"))
    if "maxLength" in s:
        f.max_length = _min(f.max_length, _count(s, "maxLength"))
    if "pattern" in s:
        if not isinstance(s["pattern"], str):
            raise _bad("pattern", "a string")
        f.patterns.append(s["pattern"])
    if "format" in s:
        if not isinstance(s["format"], str):
            raise _bad("format", "a string")
        f.formats.append(s["format"])


def _apply_array_counts(f: Flat, s: dict) -> None:
    """minItems, maxItems, uniqueItems."""
    if "minItems" in s:
        f.min_items = max(f.min_items, _count(s, "minItems"))
    if "maxItems" in s:
        f.max_items = _min(f.max_items, _count(s, "maxItems"))
    if "uniqueItems" in s:
        if not isinstance(s["uniqueItems"], bool):
            raise _bad("uniqueItems", "a boolean")
        f.unique_items = f.unique_items or s["uniqueItems"]


def _apply_object_counts(f: Flat, s: dict) -> None:
    """minProperties, maxProperties, required."""
    if "minProperties" in s:
        f.min_props = max(f.min_props, _count(s, "minProperties"))
    if "maxProperties" in s:
        f.max_props = _min(f.max_props, _count(s, "maxProperties"))
    if "required" in s:
        req = s["required"]
        if not isinstance(req, list) or any(not isinstance(r, str) for r in req):
            raise _bad("required", "an array of strings")
        f.required += [r for r in req if r not in f.required]
        f.object_keywords = True


def _apply_pending(f: Flat, s: dict) -> None:
    """Note the PENDING keywords (other than their no-op forms), refused later by type."""
    for key, value in s.items():
        if key in _PENDING_TYPE and value != PENDING[_PENDING_TYPE[key]][key]:
            f.pending.setdefault(_PENDING_TYPE[key], (key, f"'{key}' is not supported"))


def _min(a, b):
    return b if a is None else min(a, b)


def _apply_items(f: Flat, s: dict, base) -> None:
    if isinstance(s.get("items"), list):  # draft 4 to 2019-09: a tuple, then additionalItems
        prefix, rest = s["items"], s.get("additionalItems")
        items = None if rest is None else Node(_subschema(rest, "additionalItems"), base)
    else:
        prefix = s.get("prefixItems", [])
        items = Node(_subschema(s["items"], "items"), base) if "items" in s else None
    if not isinstance(prefix, list):
        raise _bad("prefixItems", "an array of schemas")
    for i, sub in enumerate(prefix):
        node = Node(_subschema(sub, "prefixItems"), base)
        if i < len(f.prefix):
            f.prefix[i].append(node)
        else:
            f.prefix.append(list(f.items or []) + [node])
    if items is not None:
        for i in range(len(prefix), len(f.prefix)):
            f.prefix[i].append(items)
        f.items = list(f.items or []) + [items]


def _apply_properties(f: Flat, s: dict, base) -> None:
    props = s.get("properties", {})
    if not isinstance(props, dict):
        raise _bad("properties", "an object of schemas")
    extra = (
        Node(_subschema(s["additionalProperties"], "additionalProperties"), base)
        if "additionalProperties" in s
        else None
    )
    patterns = s.get("patternProperties", {})
    if not isinstance(patterns, dict):
        raise _bad("patternProperties", "an object of schemas")
    f.pattern_props += [(p, [Node(_subschema(sub, "patternProperties"), base)]) for p, sub in patterns.items()]
    if s.get("propertyNames", True) is not True:
        f.property_names.append(Node(_subschema(s["propertyNames"], "propertyNames"), base))
        f.object_keywords = True
    if "properties" in s or extra is not None or patterns:
        f.object_keywords = True
    for name, sub in props.items():
        node = Node(_subschema(sub, "properties"), base)
        if name in f.props:
            f.props[name].append(node)
        else:
            f.props[name] = list(f.additional or []) + [node]
    if extra is not None:
        for name in f.props:
            if name not in props:
                f.props[name].append(extra)
        f.additional = list(f.additional or []) + [extra]
