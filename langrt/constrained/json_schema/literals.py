"""Schemas that pin their values (`const`, `enum`) beside keywords the compiler cannot write (a
`not` of `patternProperties`, of `propertyNames`, ...): the values are few and known, so each is
checked against the whole schema by jsonschema, the reference validator, and the valid ones are
the schema's language. Exact, whatever the other keywords say: langrt's own markers in the
schemas (the negations of `not`, `if` and the dependencies write: EXCLUDE, FORBID) are turned
into the standard keywords they stand for first, since jsonschema would ignore them.
"""

from __future__ import annotations

import json
from typing import Any

from langrt.constrained.json_schema.flat import EXCLUDE, FORBID, json_equal

_NONE = object()


def pinned_values(nodes) -> list | None:
    """The values `const`/`enum` allow at these nodes (an `allOf` member's too), or None when
    none of them pins its values."""
    found: list | None = None
    for node in nodes:
        for schema in _conjuncts(node.schema):
            values = [schema["const"]] if "const" in schema else schema.get("enum", _NONE)
            if values is _NONE or not isinstance(values, list):
                continue
            found = list(values) if found is None else [v for v in found if any(json_equal(v, w) for w in values)]
    return found


def valid_values(values: list, nodes) -> list:
    """The values every node's schema accepts (jsonschema, with its format checks)."""
    return [v for v in values if all(_validator(node).is_valid(v) for node in nodes)]


def _conjuncts(schema: Any):
    if isinstance(schema, dict):
        yield schema
        for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            yield from _conjuncts(sub)


def _validator(node):
    import jsonschema

    cls = jsonschema.validators.validator_for(node.base, default=jsonschema.Draft202012Validator)
    return cls(node.base, format_checker=cls.FORMAT_CHECKER).evolve(schema=standard(node.schema))


def standard(schema: Any) -> Any:
    """`schema` with EXCLUDE (values the instance must not be) written as `not: {enum}` and
    FORBID (property names it must not have) as `properties: {name: false}`, at any depth; the
    schema itself where it holds neither."""
    if isinstance(schema, list):
        items = [standard(item) for item in schema]
        return schema if all(a is b for a, b in zip(items, schema)) else items
    if not isinstance(schema, dict):
        return schema
    out = {key: standard(value) for key, value in schema.items() if key not in (EXCLUDE, FORBID)}
    extra = []
    if EXCLUDE in schema:
        extra.append({"not": {"enum": list(schema[EXCLUDE]["values"])}})
    if FORBID in schema:
        extra.append({"properties": {name: False for name in schema[FORBID]}})
    if not extra and len(out) == len(schema) and all(out[k] is schema[k] for k in out):
        return schema
    return {**out, "allOf": out.get("allOf", []) + extra} if extra else out


def compact_texts(v) -> list[str]:
    """The compact JSON texts of a value (a whole float also as an integer), as the compiler writes them."""
    texts = [json.dumps(v, separators=(",", ":"), ensure_ascii=False)]
    if isinstance(v, float) and v.is_integer():
        texts.append(str(int(v)))
    return texts
