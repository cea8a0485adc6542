"""`not` and `if` for the JSON-schema compiler: a schema's complement written as schemas, where
it can be (types, const/enum, required, properties of those, numeric and length bounds, and
the combinators over them).

negate(s) returns schemas whose union is exactly the instances `s` rejects. It works keyword by
keyword: an instance fails a conjunction when it fails one keyword, and it fails a keyword only
when the instance is of the type the keyword applies to (`required` says nothing about a
string), so each keyword's complement is typed. What has no such complement here (`pattern`,
`items`, `oneOf`, ...) raises UnsupportedSchema naming `not` (or the caller's keyword).

Two keywords exist only inside complements, keyed by tuples so no JSON schema can spell them:
FORBID (property names an object must not have) and EXCLUDE (values the instance must not be,
and the keyword that excluded them, named if they cannot be left out).
"""

from __future__ import annotations

from langrt.constrained.json_schema.flat import EXCLUDE, FORBID, TYPES
from langrt.errors import UnsupportedSchema

# The keywords that assert something (draft 4 to 2020-12); the rest (annotations, `format`,
# unknown words) say nothing about validity, so their complement is empty.
ASSERTIONS = frozenset(
    {
        "type",
        "enum",
        "const",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "items",
        "prefixItems",
        "additionalItems",
        "maxItems",
        "minItems",
        "uniqueItems",
        "contains",
        "maxContains",
        "minContains",
        "maxProperties",
        "minProperties",
        "required",
        "properties",
        "patternProperties",
        "additionalProperties",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "propertyNames",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "$ref",
        "$dynamicRef",
        "$recursiveRef",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_NUMERIC = ("integer", "number")
_BOUNDS = {
    "minimum": "exclusiveMaximum",
    "exclusiveMinimum": "maximum",
    "maximum": "exclusiveMinimum",
    "exclusiveMaximum": "minimum",
}
# Why 3: a complement of a complement of ... each level multiplies alternatives.
_MAX_DEPTH = 3


def negate(s, resolve, keyword: str = "not", depth: int = 0, narrow: bool = False) -> list:
    """Schemas whose union is the complement of `s`, or a part of it: every instance they admit
    is rejected by `s` (callers use a complement only positively, as `not`, `if`'s else branch
    and oneOf's exclusions, so a narrower one only narrows what is generated). Exact but for
    one case: not integer leaves out non-integral numbers, and, with `narrow`, the keywords
    whose complement cannot be written here, whose failures are then left out instead of
    refused. `resolve(ref)` gives a $ref's target."""
    if s is True or s == {}:
        return []
    if s is False:
        return [True]
    if not isinstance(s, dict) or depth > _MAX_DEPTH:
        if narrow:
            return []
        raise _refuse(keyword, "nests too deeply" if isinstance(s, dict) else "is not a schema")
    out = []
    for key, value in s.items():
        if key not in ASSERTIONS and not isinstance(key, tuple):
            continue  # then / else count only under `if`
        try:
            out += _negate_keyword(
                s, key, value, lambda sub: negate(sub, resolve, keyword, depth + 1, narrow), resolve, keyword
            )
        except UnsupportedSchema:
            if not narrow:
                raise
    return out


def _negate_keyword(s: dict, key, value, inner, resolve, keyword: str) -> list:
    """The complement of one keyword of `s`; `inner(sub)` negates a subschema one level down."""
    others = [t for t in TYPES if t not in _typed(key)]
    if key == "type":
        # Not an integer: other types, and numbers with a fraction, which langrt does not write
        # (left out: a complement may be narrower than exact, never wider; see negate()).
        names = {value} if isinstance(value, str) else set(value)
        rest = [t for t in TYPES if t not in names and not (t in _NUMERIC and names & set(_NUMERIC))]
        return [{"type": rest}] if rest else []
    if key in ("const", "enum"):
        return [{EXCLUDE: {"values": [value] if key == "const" else list(value), "keyword": keyword}}]
    if key == "required":
        return [{"type": "object", FORBID: [name]} for name in value]
    if key == FORBID:
        return [{"type": "object", "required": [name]} for name in value]
    if key == EXCLUDE:
        return [{"enum": list(value["values"])}]
    if key == "properties":
        return [
            {"type": "object", "required": [name], "properties": {name: n}}
            for name, sub in value.items()
            for n in inner(sub)
        ]
    if key in _BOUNDS:
        if isinstance(value, bool):
            raise _refuse(keyword, f"of a draft-4 boolean {key!r}")
        return [{"type": others}, {"type": "number", _BOUNDS[key]: value}]
    if key in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
        return _negate_count(key, value, others)
    if key == "$ref":
        return inner(resolve(value))
    if key == "allOf":
        return [n for sub in value for n in inner(sub)]
    if key == "anyOf":
        return [{"allOf": [{"anyOf": inner(sub) or [False]} for sub in value]}]
    if key == "not":
        return [value]
    if key == "if":
        then, else_ = s.get("then", True), s.get("else", True)
        return [
            {"allOf": [value, {"anyOf": inner(then) or [False]}]},
            *({"allOf": [n, {"anyOf": inner(else_) or [False]}]} for n in inner(value)),
        ]
    raise _refuse(keyword, f"of a schema with {key!r}: its complement cannot be expressed here")


def _negate_count(key: str, value: int, others: list) -> list:
    t = {"Length": "string", "Items": "array", "Properties": "object"}[key[3:]]
    if key.startswith("min"):
        return [{"type": others}] + ([{"type": t, "max" + key[3:]: value - 1}] if value > 0 else [])
    return [{"type": others}, {"type": t, "min" + key[3:]: value + 1}]


def _typed(key) -> tuple:
    """The types a keyword applies to."""
    if key in _BOUNDS:
        return _NUMERIC
    if key in ("minLength", "maxLength"):
        return ("string",)
    if key in ("minItems", "maxItems"):
        return ("array",)
    return ("object",)


def _refuse(keyword: str, why: str) -> UnsupportedSchema:
    return UnsupportedSchema(f"'{keyword}' {why}", param=keyword)
