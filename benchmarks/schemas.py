"""A seeded corpus of realistic JSON schemas (tool-call arguments, records, nested objects,
enums, arrays, formats), and a valid instance for each, for grammar benchmarks."""

from __future__ import annotations

import random
import string

NAMES = ("city unit query limit email user_id date start_date end_date status priority tags title "
         "description amount currency quantity price sku category language country timezone url "
         "phone first_name last_name age score rating enabled verbose format sort_by order page "
         "offset radius latitude longitude temperature max_results include_archived owner repo "
         "branch path message level channel recipient subject body id uuid created_at").split()  # fmt: skip
ENUMS = [["celsius", "fahrenheit"], ["asc", "desc"], ["low", "medium", "high", "urgent"],
         ["open", "closed", "pending"], ["json", "csv", "xml"], ["USD", "EUR", "GBP", "JPY"],
         ["debug", "info", "warning", "error"]]  # fmt: skip
FORMATS = ["date", "date-time", "email", "uuid", "uri", "time", "ipv4"]


def _string(rng: random.Random) -> dict:
    kind = rng.random()
    if kind < 0.15:
        return {"type": "string", "enum": rng.choice(ENUMS)}
    if kind < 0.35:
        return {"type": "string", "format": rng.choice(FORMATS)}
    if kind < 0.55:
        return {"type": "string", "maxLength": rng.choice([8, 16, 32, 64])}
    if kind < 0.62:
        return {"type": "string", "pattern": rng.choice(["^[A-Z]{3}$", "^[a-z0-9_]+$", "^[0-9]{5}$"])}
    return {"type": "string"}


def _value(rng: random.Random, depth: int) -> dict:
    kind = rng.random()
    if kind < 0.45 or depth >= 2:
        return _string(rng) if rng.random() < 0.6 else _scalar(rng)
    if kind < 0.7:
        return {"type": "array", "items": _string(rng) if rng.random() < 0.6 else _object(rng, depth + 1),
                "maxItems": rng.choice([3, 5, 10])}  # fmt: skip
    return _object(rng, depth + 1)


def _scalar(rng: random.Random) -> dict:
    kind = rng.random()
    if kind < 0.4:
        low = rng.choice([0, 1, -100])
        return {"type": "integer", "minimum": low, "maximum": low + rng.choice([10, 100, 1000])}
    if kind < 0.6:
        return {"type": "integer"}
    if kind < 0.85:
        return {"type": "number"}
    return {"type": "boolean"}


def _object(rng: random.Random, depth: int) -> dict:
    names = rng.sample(NAMES, rng.randint(1, 5 if depth else 7))
    props = {n: _value(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.6] or names[:1]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def schema_corpus(n: int = 220, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [_object(rng, 0) for _ in range(n)]


# ---- instances --------------------------------------------------------------------------------

_FORMAT_VALUES = {"date": "2024-05-17", "date-time": "2024-05-17T10:30:00Z", "email": "ann@example.com",
                  "uuid": "123e4567-e89b-12d3-a456-426614174000", "uri": "https://example.com/a",
                  "time": "10:30:00Z", "ipv4": "192.168.0.1"}  # fmt: skip
_PATTERN_VALUES = {"^[A-Z]{3}$": "ABC", "^[a-z0-9_]+$": "snake_case_1", "^[0-9]{5}$": "12345"}


def instance(schema: dict, rng: random.Random):
    """A valid instance of a schema from `schema_corpus` (every property included)."""
    t = schema.get("type")
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if t == "object":
        return {k: instance(v, rng) for k, v in schema["properties"].items()}
    if t == "array":
        return [instance(schema["items"], rng) for _ in range(rng.randint(1, min(3, schema.get("maxItems", 3))))]
    if t == "string":
        if "format" in schema:
            return _FORMAT_VALUES[schema["format"]]
        if "pattern" in schema:
            return _PATTERN_VALUES[schema["pattern"]]
        length = rng.randint(3, min(12, schema.get("maxLength", 12)))
        return "".join(rng.choice(string.ascii_letters + " ") for _ in range(length)).strip() or "x"
    if t == "integer":
        return rng.randint(schema.get("minimum", -50), schema.get("maximum", 500))
    if t == "number":
        return round(rng.uniform(-100, 100), 3)
    return rng.random() < 0.5
