"""`gen(name, reasoning=True)`: a reasoning model's output split into its thinking and its answer.

The runtime (started with `--reasoning-parser`) lets the model think freely and holds the
gen's regex / json_schema / ebnf to the answer after the end-of-thinking tag; with
`max_reasoning_tokens` it forces that tag in time. The program's text keeps the whole output
(the next turn's prompt then matches the cached tokens); `s[name]` is the answer and
`s[name + "_reasoning"]` the thinking.
"""

from __future__ import annotations

START_TAG, END_TAG = "<think>", "</think>"  # both of the runtime's parsers (qwen3, deepseek-r1) use these
REASONING_SUFFIX = "_reasoning"


def split_thinking(text: str) -> tuple[str, str]:
    """(thinking, answer): everything before the end tag is thinking (a start tag opening it
    dropped); without the end tag (cut short) there is no answer."""
    head, found, tail = text.partition(END_TAG)
    thinking = head.strip().removeprefix(START_TAG).strip()
    return thinking, tail.lstrip() if found else ""


def gen_values(name: str, value, reasoning: bool | None) -> list[tuple[str, object]]:
    """The variables a gen sets: `name` alone, or with `reasoning` the answer as `name` and the
    thinking beside it (each a list where the gen drew n samples)."""
    if not reasoning:
        return [(name, value)]
    parts = [split_thinking(v) for v in value] if isinstance(value, list) else [split_thinking(value)]
    answers, thoughts = [a for _, a in parts], [t for t, _ in parts]
    if not isinstance(value, list):
        answers, thoughts = answers[0], thoughts[0]
    return [(name, answers), (name + REASONING_SUFFIX, thoughts)]
