"""JSON decoding from a ~350-token document. Two variants:
- regex: the JSON skeleton is literal program text with a regex-constrained `gen` per value
  (SGLang's json_decode benchmark), so each value is a request repeating the document;
- schema: one `gen` constrained by a JSON schema for the whole object."""

from __future__ import annotations

import json
import random

import langrt_frontend as sgl

from benchmarks.workloads.base import Workload
from benchmarks.workloads.data import biography, person

INSTRUCTION = "Fill in a JSON record for the person in the document. Copy the values from the document."
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]+ [A-Z][a-z]+$"},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        "job": {"type": "string", "pattern": "^[a-z]+( [a-z]+)?$"},
        "years_of_experience": {"type": "integer", "minimum": 0, "maximum": 60},
        "remote": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "job", "years_of_experience", "remote"],
    "additionalProperties": False,
}


@sgl.function
def extract_regex(s, document):
    s += sgl.user(f"Document:\n{document}\n\n{INSTRUCTION}")
    s += sgl.assistant_begin()
    s += '{\n  "name": "' + sgl.gen("name", max_tokens=12, regex=r"[A-Z][a-z]+ [A-Z][a-z]+") + '",\n'
    s += '  "age": ' + sgl.gen("age", max_tokens=4, regex=r"[1-9][0-9]") + ",\n"
    s += '  "city": "' + sgl.gen("city", max_tokens=8, regex=r"[A-Z][a-z]+") + '",\n'
    s += '  "job": "' + sgl.gen("job", max_tokens=8, regex=r"[a-z]+( [a-z]+)?") + '",\n'
    s += '  "years_of_experience": ' + sgl.gen("years", max_tokens=4, regex=r"[0-9]{1,2}") + ",\n"
    s += '  "remote": ' + sgl.gen("remote", max_tokens=3, regex=r"(true|false)") + "\n}"
    s += sgl.assistant_end()


@sgl.function
def extract_schema(s, document):
    s += sgl.user(f"Document:\n{document}\n\n{INSTRUCTION}")
    s += sgl.assistant(sgl.gen("record", max_tokens=96, json_schema=json.dumps(SCHEMA)))


def items(quick: bool) -> list[dict]:
    rng = random.Random(600)
    out = []
    for _ in range(2 if quick else 8):
        p = person(rng)
        out.append({"document": biography(rng, p, filler_sentences=16), "age": p.age, "city": p.city})
    return out


def json_quality(texts: list[str], items: list[dict]) -> dict:
    """Share of outputs that parse as JSON objects, and of those with the document's age."""
    valid, right = 0, 0
    for text, item in zip(texts, items):
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            continue
        valid += isinstance(record, dict)
        right += isinstance(record, dict) and record.get("age") == item["age"]
    return {"valid_json": valid / len(items), "age_right": right / len(items)}


def regex_quality(states, items) -> dict:
    return json_quality([s.messages()[-1]["content"] for s in states], items)


def schema_quality(states, items) -> dict:
    return json_quality([s["record"] for s in states], items)


REGEX = Workload(
    name="json_regex",
    title="JSON skeleton with 6 regex gens",
    program=extract_regex,
    items=items,
    quality=regex_quality,
)
SCHEMA_WORKLOAD = Workload(
    name="json_schema",
    title="JSON object from a json_schema gen",
    program=extract_schema,
    items=items,
    quality=schema_quality,
)
