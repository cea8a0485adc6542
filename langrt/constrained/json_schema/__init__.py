"""langrt's JSON Schema (draft 2020-12, and draft 7's tuple items and dependencies) compiler.

    regex = schema_to_regex({"type": "object", "properties": {...}, "required": [...]})
    source = schema_to_grammar(schema)   # what the runtime compiles: a regex, or grammar rules

schema_to_grammar writes a value that recurses, or whose regex would be big, as a grammar rule
(rules.py) that the pushdown automaton calls (cfg/pda.py): recursion is then unbounded and
values left free nest to any depth; what follows about limits is schema_to_regex's.

The regex is matched against the whole output, by Python's `re` (tests) and by Rust's `regex`
through outlines-core (runtime); it uses only the syntax both read alike (regex.py).

Soundness is the rule: text the regex matches is JSON valid against the schema (jsonschema,
draft 2020-12). The regex may match fewer valid instances than the schema allows; where it does
on purpose:
  - objects list their properties in the schema's order (`properties`, then the `required`
    names it does not list), each at most once; no other property appears unless
    `additionalProperties` is given explicitly (then extra keys come after the listed ones, and
    are written without escapes);
  - recursion through `$ref` stops at `max_ref_depth` (deeper instances are rejected), and
    values a schema leaves free (`true`, absent `items`) nest at most ANY_VALUE_DEPTH containers;
  - numbers with bounds have no exponent; `integer` means an integer literal (no `1.0`);
  - string `format`s accept a safe subset of their RFCs (formats.py);
  - non-ASCII characters are accepted raw, or \\uXXXX-escaped where the text is literal
    (const, enum, property names).
A keyword that cannot be enforced exactly raises UnsupportedSchema whose `param` names it.

Modules: compiler.py (schema_to_regex / schema_to_grammar, the limits, values and arrays),
objects.py (objects: properties, patternProperties, counts), rules.py (values as rules),
negate.py (complements for `not` and `if`), keys.py (property-name regexes), numeric.py (number
bounds, multipleOf), flat.py (the normal form, keyword by keyword), normalize.py ($ref,
allOf/anyOf/oneOf), pattern.py (pattern), formats.py (format), regex.py (regex pieces,
literals, numeric ranges).
"""

from __future__ import annotations

from langrt.constrained.json_schema import regex as rx
from langrt.constrained.json_schema.compiler import (
    ANY_VALUE_DEPTH,
    DEFAULT_MAX_REF_DEPTH,
    DEFAULT_MAX_REGEX_LENGTH,
    FLEXIBLE_WS_MAX,
    MAX_DISJUNCTS,
    WHITESPACE_POLICIES,
    schema_to_grammar,
    schema_to_regex,
)
from langrt.constrained.json_schema.flat import Flat, Node, json_type
from langrt.constrained.json_schema.formats import format_pattern
from langrt.constrained.json_schema.normalize import Normalizer
from langrt.constrained.json_schema.numeric import MAX_LISTED_MULTIPLES
from langrt.constrained.json_schema.pattern import emit, translate, with_length
from langrt.errors import InvalidRequest, UnsupportedSchema

# The public names of json_schema.py, before it became this package.
__all__ = [
    "ANY_VALUE_DEPTH",
    "DEFAULT_MAX_REF_DEPTH",
    "DEFAULT_MAX_REGEX_LENGTH",
    "FLEXIBLE_WS_MAX",
    "MAX_DISJUNCTS",
    "MAX_LISTED_MULTIPLES",
    "WHITESPACE_POLICIES",
    "Flat",
    "InvalidRequest",
    "Node",
    "Normalizer",
    "UnsupportedSchema",
    "emit",
    "format_pattern",
    "json_type",
    "rx",
    "schema_to_grammar",
    "schema_to_regex",
    "translate",
    "with_length",
]
