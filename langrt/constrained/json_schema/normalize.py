"""Schemas in disjunctive normal form, for the JSON-schema compiler.

`Normalizer.flatten(nodes, refs)` turns a conjunction of schemas into a list of `Flat`s whose
union is EXACTLY the set of valid instances: `$ref` is inlined, `allOf` merged keyword by
keyword (flat.py), `anyOf` / `oneOf` distributed.

`oneOf` is accepted only when its branches are provably disjoint (`excludes`): generated text
from one branch must be invalid under every other branch, or oneOf would reject it.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urljoin

from langrt.constrained.json_schema.flat import (
    FORBID,
    REFUSED,
    Flat,
    Node,
    _apply_keywords,
    _bad,
    _list,
    _satisfiable,
    _subschema,
    json_equal,
    json_type,
)
from langrt.constrained.json_schema.negate import negate
from langrt.constrained.json_schema.resources import Resources
from langrt.errors import UnsupportedSchema


class DepthExceeded(Exception):
    """A proof (oneOf disjointness) ran into the $ref depth limit: nothing can be concluded."""


class Normalizer:
    def __init__(self, root, max_ref_depth: int, max_disjuncts: int):
        self.root = root
        self.max_ref_depth = max_ref_depth
        self.max_disjuncts = max_disjuncts
        self.depth_hit = False  # some $ref recursion was cut at max_ref_depth
        self.proving = 0  # > 0 while proving oneOf disjointness (depth cut-offs prove nothing)
        self.resources = Resources(root)
        self.open_objects = False  # set by the compiler: objects may hold keys the schema does not list
        self._written: dict = {}  # id(schema) -> _branches, ("oneOf", id) -> _exclusive (the schema outlives the compile)

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
            flats = [
                g
                for sub in _list(s, "anyOf")
                for g in self.conjoin([f.clone() for f in flats], Node(_subschema(sub, "anyOf"), base))
            ]
            self._check_size(flats, "anyOf")
        if "oneOf" in s:
            branches = [
                self.conjoin([f.clone() for f in flats], Node(_subschema(sub, "oneOf"), base))
                for sub in _list(s, "oneOf")
            ]
            branches = [[f for f in b if _satisfiable(f)] for b in branches]
            overlap = self._overlap(branches)
            if overlap is not None:
                exclusive, narrowed = self._exclusive(s, base)
                branches = [self.conjoin([f.clone() for f in flats], Node(x, base)) for x in exclusive]
                if narrowed and not any(_satisfiable(f) for b in branches for f in b):
                    raise UnsupportedSchema(
                        f"oneOf branches {overlap[0]} and {overlap[1]} may both match one instance, and their "
                        "complements cannot be written to keep them apart; use anyOf if overlap is fine",
                        param="oneOf",
                    )
            flats = [g for b in branches for g in b]
            self._check_size(flats, "oneOf")
        for keyword, branches in self._branches(s, base):
            flats = [g for sub in branches for g in self.conjoin([f.clone() for f in flats], Node(sub, base))]
            self._check_size(flats, keyword)
        return flats

    def _branches(self, s: dict, base):
        """(keyword, schemas whose union the instance must be in) for `not`, `if` and the
        dependencies. Written once per schema and kept: flats hold their nodes by identity."""
        found = self._written.get(id(s))
        if found is None:
            found = self._written[id(s)] = list(self._write_branches(s, base))
        return found

    def _write_branches(self, s: dict, base):
        def resolve(ref):
            return self.resolve(ref, base)[0]

        if "not" in s:
            yield "not", negate(_subschema(s["not"], "not"), resolve)
        if "if" in s:
            then, else_ = s.get("then", True), s.get("else", True)
            yield "if", [{"allOf": [s["if"], then]}] + [{"allOf": [n, else_]} for n in negate(s["if"], resolve, "if")]
        for keyword in ("dependencies", "dependentRequired", "dependentSchemas"):
            deps = s.get(keyword, {})
            if not isinstance(deps, dict):
                raise _bad(keyword, "an object")
            for name, dep in deps.items():
                then = {"required": dep} if isinstance(dep, list) else _subschema(dep, keyword)
                yield keyword, [{FORBID: [name]}, {"required": [name], "allOf": [then]}]

    def _check_size(self, flats, keyword):
        flats[:] = [f for f in flats if _satisfiable(f)]
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

    def _overlap(self, branches: list[list[Flat]]) -> tuple[int, int] | None:
        """Two oneOf branches not proved disjoint, or None."""
        for i, bi in enumerate(branches):
            for j, bj in enumerate(branches):
                if i != j and not all(self.excludes(a, b) for a in bi for b in bj):
                    return i, j
        return None

    def _exclusive(self, s: dict, base) -> tuple[list, bool]:
        """oneOf's branches made exclusive: branch i and the complement of every other one (exact
        where negate.py can write the complements; else each complement leaves out the failures
        it cannot write, so branch i keeps only instances proved to fail the others: narrower
        than the schema, never wider), and whether they were narrowed."""
        key = ("oneOf", id(s))
        if key not in self._written:
            subs = _list(s, "oneOf")
            resolve = lambda ref: self.resolve(ref, base)[0]  # noqa: E731
            try:
                nots, narrowed = [{"anyOf": negate(sub, resolve, "oneOf") or [False]} for sub in subs], False
            except UnsupportedSchema:
                nots, narrowed = (
                    [{"anyOf": negate(sub, resolve, "oneOf", narrow=True) or [False]} for sub in subs],
                    True,
                )
            self._written[key] = ([{"allOf": [sub] + nots[:i] + nots[i + 1 :]} for i, sub in enumerate(subs)], narrowed)
        return self._written[key]

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
        if set(a.required) & set(b.forbidden) or set(b.required) & set(a.forbidden):
            return True
        names = set(a.props) | set(a.required)
        # `a`'s objects hold no other key: additionalProperties false, or absent where the
        # compiler writes only listed keys (not with open objects)
        closed = (a.additional is None and not self.open_objects) or a.additional == [] or _is_false(a.additional or [])
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
        if any(json_equal(v, x) for x in b.excluded):
            return True
        if b.enum is not None and not any(json_equal(v, e) for e in b.enum):
            return True
        if t in ("integer", "number"):
            return any(v < x or (ex and v == x) for x, ex in b.lower) or any(
                v > x or (ex and v == x) for x, ex in b.upper
            )
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
            if any(q not in v for q in b.required) or len(v) < b.min_props or any(q in v for q in b.forbidden):
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
