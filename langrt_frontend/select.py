"""`select` as one prefill-only request (docs/programs.md, select).

The request is a batch: the prefix alone, then `prefix + choice` for every choice, then (for
unconditional_likelihood_normalized) every choice alone. Input logprobs start at `start`, a
position known to lie inside the prefix, so the cached part of the prefix is reused. A choice's
tokens are those of `prefix + choice` past the longest run of token ids it shares with the
prefix alone, minus any further tokens that still end inside the prefix's text: a token merging
prefix and choice text counts for the choice, a pure-prefix token does not.
"""

from __future__ import annotations

from typing import Sequence

from langrt_frontend.choices import mean_logprob

# Tokens before a known token count that may still change when text is appended (the last
# token of a text can merge with what follows).
_MERGE_MARGIN = 2


def score_choices(
    backend, prefix: str, choices: Sequence[str], method, known_tokens: int = 0, prepare=None, extra: dict | None = None
) -> tuple[str, dict]:
    """The winning choice and the select's meta info. `prepare(payload)` may add to the request;
    `extra` fields go with it (the program's LoRA adapter)."""
    if not choices:
        raise ValueError("select needs at least one choice")
    start = max(0, known_tokens - _MERGE_MARGIN) if prefix else 0
    texts = ([prefix] if prefix else []) + [prefix + c for c in choices]
    starts = [start] * len(texts)
    if method.requires_unconditional:
        texts += list(choices)
        starts += [0] * len(choices)
    payload = {
        "text": texts,
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": starts,
        "return_text_in_logprobs": True,
        **(extra or {}),
    }
    if prepare is not None:
        prepare(payload)
    responses = backend.generate(payload)
    metas = [r["meta_info"] for r in responses]
    prefix_entries = metas.pop(0)["input_token_logprobs"] if prefix else []
    k = len(choices)
    rows = [m["input_token_logprobs"] for m in metas]
    outputs = [m.get("output_token_logprobs", []) for m in metas[:k]]
    return decide(choices, method, prefix_entries, rows[:k], rows[k:] or None, outputs)


def decide(
    choices: Sequence[str], method, prefix_entries: list, rows: list, unconditional=None, outputs=None
) -> tuple[str, dict]:
    """The winner and the meta info, from the prefix's entries, each `prefix + choice` row's
    (both from the same start) and, for methods that need them, each choice's scored alone."""
    conditional = [choice_tokens(prefix_entries, row) for row in rows]
    result = method(conditional, unconditional)
    meta = {
        "normalized_prompt_logprobs": [mean_logprob(c) for c in conditional],
        "input_token_logprobs": conditional,
        "output_token_logprobs": outputs if outputs is not None else [[] for _ in choices],
        **result.meta,
    }
    return choices[result.index], meta


def choice_tokens(prefix_entries: list, entries: list) -> list:
    """The entries of `prefix + choice` that belong to the choice (both lists start at the same
    prompt position)."""
    shared = 0
    while shared < min(len(prefix_entries), len(entries)) and prefix_entries[shared][1] == entries[shared][1]:
        shared += 1
    rest = entries[shared:]
    if shared == len(prefix_entries):
        return rest
    # The tokenizations diverge inside the prefix: skip tokens that end within its remaining text.
    prefix_chars = sum(len(e[2] or "") for e in prefix_entries[shared:])
    consumed = 0
    for i, entry in enumerate(rest):
        consumed += len(entry[2] or "")
        if consumed > prefix_chars:
            return rest[i:]
    return []
