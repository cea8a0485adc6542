"""Checks that refuse a request which could never run, with an error naming the cause.

The main process runs them before a request is sent (so the client gets a 400 at once), and the
scheduler again on arrival (the limits are its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from langrt.errors import CapacityExceeded, InvalidRequest
from langrt.sampling.sampling_params import SamplingParams


# Why 1 MB: compiling a schema costs more than linear time in its size (a 1.4 MB enum takes a
# minute), and a check that outlives its time limit still runs to the end in the background;
# real schemas, descriptions included, are far smaller.
MAX_GRAMMAR_CHARS = 1_000_000


@dataclass(frozen=True)
class Limits:
    context_len: int
    vocab_size: int
    kv_pool_size: int


def validate_request(input_ids: Sequence[int], params: SamplingParams, limits: Limits, grammar: bool = True) -> None:
    """`grammar=False` leaves out `check_grammar` (the main process runs it off its event loop)."""
    if not input_ids:
        raise InvalidRequest("the prompt is empty", param="text")
    vocab = limits.vocab_size
    if any(not (isinstance(t, int) and 0 <= t < vocab) for t in input_ids):
        raise InvalidRequest(f"input_ids contain token ids outside [0, {vocab})", param="input_ids")
    if any(t >= vocab for t in params.stop_token_ids):  # min_new_tokens would index logits with them
        raise InvalidRequest(f"stop_token_ids contain token ids outside [0, {vocab})", param="stop_token_ids")
    prompt_len = len(input_ids)
    if prompt_len >= limits.context_len:
        raise InvalidRequest(
            f"the prompt has {prompt_len} tokens; the context length is {limits.context_len}", param="prompt"
        )
    if prompt_len + params.max_new_tokens > limits.context_len:
        raise InvalidRequest(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the context "
            f"length {limits.context_len}",
            param="max_new_tokens",
        )
    need = prompt_len + params.max_new_tokens
    if need > limits.kv_pool_size:
        raise CapacityExceeded(
            f"the request needs up to {need} KV slots; the pool holds {limits.kv_pool_size} (raise --max-total-tokens)",
            param="max_new_tokens",
        )
    check_grammar_size(params)
    if grammar:
        check_grammar(params)


def check_grammar_size(params: SamplingParams) -> None:
    """Refuse an oversized grammar before any work on it (cheap: run on the event loop)."""
    sizes = {kind: len(getattr(params, kind) or "") for kind in ("regex", "json_schema", "ebnf", "structural_tag")}
    sizes["choices"] = sum(map(len, params.choices or ()))
    for kind, size in sizes.items():
        if size > MAX_GRAMMAR_CHARS:
            raise InvalidRequest(f"the {kind} is {size} characters, over the limit of {MAX_GRAMMAR_CHARS}", param=kind)


def check_grammar(params: SamplingParams) -> None:
    """Compile what is cheap to check here, so the client hears of a bad grammar at once: the
    regex's syntax (with the position), the schema's unsupported keywords (naming them)."""
    from langrt.constrained.spec import GrammarSpec

    spec = GrammarSpec.from_params(params)
    if spec is None:
        return
    try:
        spec.translate()
    except RecursionError:  # a schema nested past the interpreter's recursion limit
        raise InvalidRequest(f"the {spec.kind} nests too deeply to compile", param=spec.kind) from None
