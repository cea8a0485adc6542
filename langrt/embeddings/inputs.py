"""An embeddings request's input as token id lists, checked: OpenAI's `input` is a string, a
list of strings, a list of token ids or a list of such lists."""

from __future__ import annotations

from typing import Any, Callable

from langrt.errors import InvalidRequest

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request


def embedding_inputs(
    raw: Any, tokenize: Callable[[str], list[int]], context_len: int, vocab_size: int
) -> list[list[int]]:
    """-> one token id list per input; InvalidRequest (HTTP 400) for an empty, malformed or
    too long input."""
    items = _as_items(raw)
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"input has {len(items)} items; at most {MAX_INPUTS} per request", "input")
    out = []
    for i, item in enumerate(items):
        ids = tokenize(item) if isinstance(item, str) and item else item
        if not ids:
            raise InvalidRequest(f"input[{i}] is empty; every input needs at least one token", "input")
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size for t in ids):
            raise InvalidRequest(f"input[{i}] holds a token id outside 0..{vocab_size - 1}", "input")
        if len(ids) > context_len:
            raise InvalidRequest(
                f"input[{i}] is {len(ids)} tokens; this model embeds at most {context_len}: shorten or split it",
                "input",
            )
        out.append(list(ids))
    return out


def _as_items(raw: Any) -> list:
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("input must be a string, a non-empty list of strings, or token ids", "input")
    if all(isinstance(x, int) for x in raw):
        return [raw]  # one input given as token ids
    if all(isinstance(x, (str, list)) for x in raw):
        return raw
    raise InvalidRequest("input must be a string, a list of strings, a list of token ids, or a list of those", "input")
