"""An OpenAI request's `response_format` -> langrt's sampling parameters.

`json_schema.strict` picks the JSON schema mode (docs/structured_outputs.md, "Modes and
defaults") where the request's `json_schema_options` does not: `true` is the default mode
(closed objects in the schema's order, as OpenAI's strict outputs), `false` reads the schema as
given (`open_objects`), and leaving it out keeps the default. Asking for both strict output and
a relaxed mode is refused rather than one silently winning.
"""

from __future__ import annotations

import json

from langrt.errors import InvalidRequest

PARAM = "response_format"


def apply_response_format(sampling: dict, response_format) -> None:
    """Write what `response_format` asks for into `sampling` (a sampling_params dict)."""
    if response_format is None:
        return
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        sampling["json_schema"] = json.dumps({"type": "object"})
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise InvalidRequest("response_format.json_schema.schema must be a JSON schema object", param=PARAM)
        sampling["json_schema"] = json.dumps(spec["schema"])
        _apply_strict(sampling, spec.get("strict"))
    elif kind == "structural_tag":  # SGLang's: {"type", "structures", "triggers"}
        sampling["structural_tag"] = json.dumps(response_format)
    else:
        raise InvalidRequest(
            "response_format.type must be text, json_object, json_schema or structural_tag", param=PARAM
        )


def _apply_strict(sampling: dict, strict) -> None:
    if strict is None:
        return
    if not isinstance(strict, bool):
        raise InvalidRequest(f"response_format.json_schema.strict must be true or false, not {strict!r}", param=PARAM)
    relaxed = _asks_for_options(sampling.get("json_schema_options"))
    if strict and relaxed:
        raise InvalidRequest(
            "response_format.json_schema.strict true asks for closed objects in the schema's order, "
            "which json_schema_options relaxes: send one of them",
            param=PARAM,
        )
    if not strict and not relaxed:
        sampling["json_schema_options"] = ["open_objects"]


def _asks_for_options(options) -> bool:
    """Whether json_schema_options (a list of names or an object of booleans) turns any on; a
    malformed value counts as asking, and SamplingParams names what is wrong with it."""
    if options is None:
        return False
    if isinstance(options, dict):
        return any(value is not False for value in options.values())
    return not isinstance(options, (list, tuple)) or len(options) > 0
