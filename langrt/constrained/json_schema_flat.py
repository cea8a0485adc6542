"""Schemas in disjunctive normal form, for the JSON-schema compiler (json_schema.py).

`Normalizer.flatten(nodes, refs)` turns a conjunction of schemas into a list of `Flat`s whose
union is EXACTLY the set of valid instances: `$ref` is inlined, `allOf` merged keyword by
keyword, `anyOf` / `oneOf` distributed. Subschemas (properties, items, ...) stay unexpanded as
lists of `Node`s (conjunctions), flattened when their turn comes. A keyword langrt cannot
enforce raises UnsupportedSchema naming it, at once, or (`uniqueItems`, `patternProperties`,
...) only when an instance of the type it applies to can be generated (`pending`).

`oneOf` is accepted only when its branches are provably disjoint (`excludes`): generated text
from one branch must be invalid under every other branch, or oneOf would reject it.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urljoin

from langrt.errors import UnsupportedSchema

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")

# Keywords no regex here enforces, refused wherever they appear...
REFUSED = {
    "not": "'not' cannot be expressed as a regex here",
    "if": "conditional schemas (if/then/else) are not supported",
    "then": "conditional schemas (if/then/else) are not supported",
    "else": "conditional schemas (if/then/else) are not supported",
    "$dynamicRef": "dynamic references are not supported",
    "$recursiveRef": "recursive references (draft 2019-09) are not supported",
    "dependencies": "'dependencies' (draft 7) is not supported",
}
# ...and ones refused only when a value of their type could be generated. A value listed is
# the keyword's no-op form, accepted.
PENDING = {
    "object": {"patternProperties": {}, "propertyNames": True, "dependentRequired": {},
               "dependentSchemas": {}, "unevaluatedProperties": True},
    "array": {"contains": None, "minContains": None, "maxContains": None,
              "unevaluatedItems": True, "additionalItems": None},
}  # fmt: skip
_PENDING_TYPE = {k: t for t, ks in PENDING.items() for k in ks}


class DepthExceeded(Exception):
    """A proof (oneOf disjointness) ran into the $ref depth limit: nothing can be concluded."""


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
    pending: dict = field(default_factory=dict)  # type -> (keyword, message)
    refs: tuple = ()  # $ref targets inlined on the way here (the recursion depth)

    def clone(self) -> "Flat":
        new = copy.copy(self)
        for name in ("types", "lower", "upper", "multiple_of", "patterns", "formats", "required"):
            setattr(new, name, list(getattr(self, name)) if name != "types" else set(self.types))
        new.prefix = [list(p) for p in self.prefix]
        new.props = {k: list(v) for k, v in self.props.items()}
        new.pending = dict(self.pending)
        return new


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


# Keywords whose value is a subschema, a list of them, or a name -> subschema map: where
# embedded resources ($id) and anchors can sit. Data keywords (const, enum, default) are not
# walked, so a "$id" inside an example value is not mistaken for a resource.
_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_SUBSCHEMA_LISTS = ("prefixItems", "allOf", "anyOf", "oneOf")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


class _Resources:
    """The schema resources of one document: each `$id` (resolved against its parent's URI)
    and each `$anchor` / `$dynamicAnchor` (read as a plain anchor by `$ref`)."""

    def __init__(self, root):
        self.by_uri: dict[str, Any] = {}
        self.anchors: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._uri_of: dict[int, str] = {}
        self._walk(root, root, "", top=True)

    def uri(self, resource) -> str:
        return self._uri_of.get(id(resource), "")

    def _walk(self, s, resource, uri: str, top: bool = False) -> None:
        if not isinstance(s, dict):
            return
        if top or isinstance(s.get("$id"), str):
            uri = urljoin(uri, s.get("$id", "")).partition("#")[0]
            resource = s
            self._uri_of[id(s)] = uri
            self.by_uri.setdefault(uri, s)
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(s.get(key), str):
                self.anchors.setdefault((uri, s[key]), (s, resource))
        for key in _SUBSCHEMA:
            self._walk(s.get(key), resource, uri)
        for key in _SUBSCHEMA_LISTS:
            for sub in s.get(key) if isinstance(s.get(key), list) else [s.get(key)]:
                self._walk(sub, resource, uri)
        for key in _SUBSCHEMA_MAPS:
            if isinstance(s.get(key), dict):
                for sub in s[key].values():
                    self._walk(sub, resource, uri)


class Normalizer:
    def __init__(self, root, max_ref_depth: int, max_disjuncts: int):
        self.root = root
        self.max_ref_depth = max_ref_depth
        self.max_disjuncts = max_disjuncts
        self.depth_hit = False  # some $ref recursion was cut at max_ref_depth
        self.proving = 0  # > 0 while proving oneOf disjointness (depth cut-offs prove nothing)
        self.resources = _Resources(root)

    # -- flattening ------------------------------------------------------------------------

    def flatten(self, nodes, refs: tuple = ()) -> list[Flat]:
        flats = [Flat(refs=refs)]
        for node in nodes:
            flats = self.conjoin(flats, node)
            if not flats:
                break
        return [f for f in flats if _satisfiable(f)]

    def conjoin(self, flats: list[Flat], node: Node) -> list[Flat]:
        s = node.schema
        if s is True:
            return flats
        if s is False:
            return []
        if not isinstance(s, dict):
            raise UnsupportedSchema(f"invalid schema: expected an object or a boolean, got {s!r}", param="json_schema")
        for key in s:
            if key in REFUSED:
                raise UnsupportedSchema(f"'{key}' is not supported: {REFUSED[key]}", param=key)
        base = s if ("$id" in s and s is not self.root) else node.base
        for f in flats:
            _apply_keywords(f, s, base)
        if "$ref" in s:
            flats = self._conjoin_ref(flats, s["$ref"], base)
        for sub in _list(s, "allOf"):
            flats = self.conjoin(flats, Node(_subschema(sub, "allOf"), base))
        if "anyOf" in s:
            flats = [g for sub in _list(s, "anyOf") for g in self.conjoin([f.clone() for f in flats], Node(_subschema(sub, "anyOf"), base))]
            self._check_size(flats, "anyOf")
        if "oneOf" in s:
            branches = [self.conjoin([f.clone() for f in flats], Node(_subschema(sub, "oneOf"), base)) for sub in _list(s, "oneOf")]
            branches = [[f for f in b if _satisfiable(f)] for b in branches]
            self._check_disjoint(branches)
            flats = [g for b in branches for g in b]
            self._check_size(flats, "oneOf")
        return flats

    def _check_size(self, flats, keyword):
        if len(flats) > self.max_disjuncts:
            raise UnsupportedSchema(
                f"schema too complex: combining anyOf/oneOf/allOf gives more than {self.max_disjuncts} alternatives",
                param="json_schema",
            )

    def _conjoin_ref(self, flats: list[Flat], ref, base) -> list[Flat]:
        target, target_base = self.resolve(ref, base)
        out = []
        for f in flats:
            if f.refs.count(id(target)) >= self.max_ref_depth:
                if self.proving:
                    raise DepthExceeded
                self.depth_hit = True
                continue  # deeper recursion is cut: no instance from here (sound)
            f.refs = f.refs + (id(target),)
            out.extend(self.conjoin([f], Node(target, target_base)))
        return out

    def resolve(self, ref, base) -> tuple[Any, Any]:
        """The schema `ref` names, read against the resource `base`, and that schema's resource."""
        if not isinstance(ref, str):
            raise _bad("$ref", "a string")
        uri, _, fragment = urljoin(self.resources.uri(base), ref).partition("#")
        doc = self.resources.by_uri.get(uri)
        if doc is None:
            raise UnsupportedSchema(
                f"$ref {ref!r}: {uri!r} is not a resource of this schema (only references within the schema are "
                "followed; remote schemas are never fetched)",
                param="$ref",
            )
        pointer = unquote(fragment)
        if pointer and not pointer.startswith("/"):
            if (uri, pointer) not in self.resources.anchors:
                raise UnsupportedSchema(f"$ref {ref!r}: no $anchor {pointer!r} in {uri or 'the schema'}", param="$ref")
            return self.resources.anchors[(uri, pointer)]
        target, target_base = doc, doc
        for token in pointer.split("/")[1:] if pointer else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise UnsupportedSchema(f"$ref {ref!r} points at nothing in the schema", param="$ref")
            if isinstance(target, dict) and "$id" in target:
                target_base = target
        return _subschema(target, "$ref"), target_base

    def _check_disjoint(self, branches: list[list[Flat]]) -> None:
        for i, bi in enumerate(branches):
            for j, bj in enumerate(branches):
                if i != j and not all(self.excludes(a, b) for a in bi for b in bj):
                    raise UnsupportedSchema(
                        f"oneOf branches {i} and {j} may both match one instance; langrt accepts oneOf only when "
                        "its branches are provably disjoint (different types, distinct const/enum values, or a "
                        "required property with distinct const values), use anyOf if overlap is fine",
                        param="oneOf",
                    )

    # -- proofs ----------------------------------------------------------------------------

    def excludes(self, a: Flat, b: Flat) -> bool:
        """Every instance generated from `a` is invalid under `b` (False: not proved)."""
        self.proving += 1
        try:
            return self._excludes(a, b)
        except (DepthExceeded, UnsupportedSchema):
            return False
        finally:
            self.proving -= 1

    def _excludes(self, a: Flat, b: Flat) -> bool:
        if a.enum is not None:
            return all(self.rejects(b, v) for v in a.enum)
        return all(self._excludes_type(a, b, t) for t in _emitted_types(a))

    def _excludes_type(self, a: Flat, b: Flat, t: str) -> bool:
        accepted = b.types | ({"integer"} if "number" in b.types else set())
        if t == "number":  # decimals like 1.0 are integers too
            accepted = accepted | ({"number"} if "integer" in b.types else set())
        if t not in accepted:
            return True
        if b.enum is not None and not any(_same_kind(json_type(v), t) for v in b.enum):
            return True
        if t in ("integer", "number"):
            return _ranges_disjoint(a, b)
        if t == "string":
            return (b.max_length is not None and a.min_length > b.max_length) or (
                a.max_length is not None and a.max_length < b.min_length
            )
        if t == "object" and a.object_keywords:
            return self._objects_disjoint(a, b)
        if t == "array":
            return self._arrays_disjoint(a, b)
        return False

    def _objects_disjoint(self, a: Flat, b: Flat) -> bool:
        names = set(a.props) | set(a.required)
        closed = a.additional is None or a.additional == [] or _is_false(a.additional)
        if closed and any(q not in names for q in b.required):
            return True
        if b.max_props is not None and len(set(a.required)) > b.max_props:
            return True
        for p in a.required:
            b_p = b.props.get(p, b.additional)
            if b_p is None:
                continue
            a_p = a.props.get(p) or a.additional or []
            if self._nodes_exclude(a_p, a.refs, b_p, b.refs):
                return True
        return False

    def _arrays_disjoint(self, a: Flat, b: Flat) -> bool:
        if (b.max_items is not None and a.min_items > b.max_items) or (
            a.max_items is not None and a.max_items < b.min_items
        ):
            return True
        for i in range(a.min_items):
            a_i = a.prefix[i] if i < len(a.prefix) else a.items or []
            b_i = b.prefix[i] if i < len(b.prefix) else b.items
            if b_i is not None and self._nodes_exclude(a_i, a.refs, b_i, b.refs):
                return True
        return False

    def _nodes_exclude(self, a_nodes, a_refs, b_nodes, b_refs) -> bool:
        fa, fb = self.flatten(a_nodes, a_refs), self.flatten(b_nodes, b_refs)
        return all(self._excludes(x, y) for x in fa for y in fb)

    def rejects(self, b: Flat, v) -> bool:
        """`v` is invalid under `b` (False: not proved)."""
        t = json_type(v)
        if not (t in b.types or (t == "integer" and "number" in b.types)):
            return True
        if b.enum is not None and not any(json_equal(v, e) for e in b.enum):
            return True
        if t in ("integer", "number"):
            return any(v < x or (ex and v == x) for x, ex in b.lower) or any(v > x or (ex and v == x) for x, ex in b.upper)
        if t == "string":
            if len(v) < b.min_length or (b.max_length is not None and len(v) > b.max_length):
                return True
            return any(_search_fails(p, v) for p in b.patterns)
        if t == "array":
            if len(v) < b.min_items or (b.max_items is not None and len(v) > b.max_items):
                return True
            for i, x in enumerate(v):
                sub = b.prefix[i] if i < len(b.prefix) else b.items
                if sub is not None and self._nodes_reject(sub, b.refs, x):
                    return True
            return False
        if t == "object":
            if any(q not in v for q in b.required) or len(v) < b.min_props:
                return True
            if b.max_props is not None and len(v) > b.max_props:
                return True
            for k, x in v.items():
                sub = b.props.get(k, b.additional)
                if sub is not None and self._nodes_reject(sub, b.refs, x):
                    return True
        return False

    def _nodes_reject(self, nodes, refs, v) -> bool:
        return all(self.rejects(f, v) for f in self.flatten(nodes, refs))


def _search_fails(pattern: str, v: str) -> bool:
    try:
        return re.search(pattern, v) is None  # what jsonschema itself runs
    except re.error:
        return False


def _same_kind(vt: str, t: str) -> bool:
    numeric = ("integer", "number")
    return vt == t or (vt in numeric and t in numeric)


def _emitted_types(f: Flat) -> set:
    types = set(f.types)
    if "number" in types:
        types.discard("integer")  # the number branch covers integer literals
    return types


def _ranges_disjoint(a: Flat, b: Flat) -> bool:
    a_lo, a_hi = _tightest(a.lower, max), _tightest(a.upper, min)
    b_lo, b_hi = _tightest(b.lower, max), _tightest(b.upper, min)

    def below(hi, lo) -> bool:  # every value <= hi is below every value >= lo
        if hi is None or lo is None:
            return False
        return hi[0] < lo[0] or (hi[0] == lo[0] and (hi[1] or lo[1]))

    return below(a_hi, b_lo) or below(b_hi, a_lo)


def _tightest(bounds, pick):
    """The tightest (value, exclusive) bound, comparing exactly (Decimal)."""
    if not bounds:
        return None
    best = None
    for v, ex in bounds:
        d = Decimal(v)
        if best is None or pick(d, best[0]) != best[0] or (d == best[0] and ex):
            best = (d, ex or (best is not None and d == best[0] and best[1]))
    return best


def _is_false(nodes) -> bool:
    return any(n.schema is False for n in nodes)


def _list(s: dict, key: str) -> list:
    if key not in s:
        return []
    v = s[key]
    if not isinstance(v, list) or not v:
        raise _bad(key, "a non-empty array of schemas")
    return v


def _satisfiable(f: Flat) -> bool:
    if not f.types or (f.enum is not None and not f.enum):
        return False
    return True


def _apply_keywords(f: Flat, s: dict, base) -> None:
    """Merge the assertion keywords of `s` (not $ref / combinators) into `f`, exactly."""
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
    for key, dest, ex in (("minimum", f.lower, False), ("exclusiveMinimum", f.lower, True),
                          ("maximum", f.upper, False), ("exclusiveMaximum", f.upper, True)):  # fmt: skip
        if key in s:
            dest.append((_number(s, key), ex))
    if "multipleOf" in s:
        m = _number(s, "multipleOf")
        if m <= 0:
            raise _bad("multipleOf", "a number > 0")
        f.multiple_of.append(m)
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
    if "minItems" in s:
        f.min_items = max(f.min_items, _count(s, "minItems"))
    if "maxItems" in s:
        f.max_items = _min(f.max_items, _count(s, "maxItems"))
    if "uniqueItems" in s:
        if not isinstance(s["uniqueItems"], bool):
            raise _bad("uniqueItems", "a boolean")
        f.unique_items = f.unique_items or s["uniqueItems"]
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
    _apply_items(f, s, base)
    _apply_properties(f, s, base)
    for key, value in s.items():
        if key in _PENDING_TYPE and value != PENDING[_PENDING_TYPE[key]][key]:
            f.pending.setdefault(_PENDING_TYPE[key], (key, f"'{key}' is not supported"))


def _min(a, b):
    return b if a is None else min(a, b)


def _apply_items(f: Flat, s: dict, base) -> None:
    if "items" in s and isinstance(s["items"], list):
        raise UnsupportedSchema("'items' as an array is draft 2019-09 and older: use 'prefixItems'", param="items")
    prefix = s.get("prefixItems", [])
    if not isinstance(prefix, list):
        raise _bad("prefixItems", "an array of schemas")
    items = Node(_subschema(s["items"], "items"), base) if "items" in s else None
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
    extra = Node(_subschema(s["additionalProperties"], "additionalProperties"), base) if "additionalProperties" in s else None
    if "properties" in s or extra is not None:
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
