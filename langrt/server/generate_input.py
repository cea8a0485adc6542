"""A generate call as the user wrote it (`GenerateCall`: Engine.generate's arguments, the native
/generate body) checked and normalized into what the tokenizer manager sends on
(`GenerateInput`: token ids, sampling params and `RequestOptions` per prompt)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langrt.errors import CapacityExceeded, InvalidRequest
from langrt.messages import RequestOptions
from langrt.sampling.sampling_params import SamplingParams

# Why 20 (vLLM's default limit, and OpenAI's): the top lists cost prompt positions x this many
# entries in every process; 300 positions x the whole vocabulary took 57 s and 11 GB of memory.
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, kw_only=True)
class GenerateCall:
    """The fields of one generate call, as given: each per-prompt field is one value for all
    prompts or a list with one entry per prompt."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: Any = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    lora_path: str | list[str | None] | None = None  # a LoRA adapter's name (None: the base model)


@dataclass
class GenerateInput:
    """One call's prompts as token ids, with one entry per prompt in each list."""

    input_ids: list[list[int]]
    params: list[SamplingParams]
    rids: list[str | None]
    options: list[RequestOptions]

    def __post_init__(self):
        n = len(self.input_ids)
        for name in ("params", "rids", "options"):
            assert len(getattr(self, name)) == n, f"{name} must have one entry per prompt"

    @property
    def stream(self) -> bool:
        return any(o.stream for o in self.options)


def make_generate_input(tokenize, call: GenerateCall, max_prompts: int | None = None) -> tuple[GenerateInput, bool]:
    """Check and normalize a call; raises InvalidRequest naming the field. Returns the input and
    whether the caller asked for a batch (a list answer). A batch of more than `max_prompts` is
    refused before anything is tokenized."""
    prompts, is_batch = _prompts(tokenize, call.text, call.input_ids, max_prompts)
    n = len(prompts)
    sampling = _per_item(call.sampling_params, n, "sampling_params", (dict, SamplingParams, type(None)))
    params = [p if isinstance(p, SamplingParams) else SamplingParams.from_dict(p) for p in sampling]
    rids = _per_item(call.rid, n, "rid", (str, type(None)))
    return_logprob = [bool(v) for v in _per_item(call.return_logprob, n, "return_logprob", (bool, type(None)))]
    starts = _per_item(call.logprob_start_len, n, "logprob_start_len", (int, type(None)))
    tops = [v or 0 for v in _per_item(call.top_logprobs_num, n, "top_logprobs_num", (int, type(None)))]
    with_text = _flag(call.return_text_in_logprobs, "return_text_in_logprobs")
    stream = _flag(call.stream, "stream")
    loras = _per_item(call.lora_path, n, "lora_path", (str, type(None)))
    if any(v is not None and v < -1 for v in starts):
        raise InvalidRequest(
            "logprob_start_len must be >= -1 (-1: output logprobs only; the whole prompt for a prefill-only request)",
            param="logprob_start_len",
        )
    if any(not 0 <= v <= MAX_TOP_LOGPROBS for v in tops):
        raise InvalidRequest(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs_num")
    options = [
        RequestOptions(
            return_logprob=want,
            logprob_start_len=_logprob_start(start, p),
            top_logprobs_num=top,
            return_text_in_logprobs=with_text,
            stream=stream,
            lora_path=lora,
        )
        for want, start, top, p, lora in zip(return_logprob, starts, tops, params, loras)
    ]
    inp = GenerateInput(prompts, params, rids, options)
    return inp, is_batch or any(p.n > 1 for p in params)


def _logprob_start(value: int | None, params: SamplingParams) -> int:
    """The first prompt position whose logprob a request reports. Omitted or -1: none, only the
    output's, except in a prefill-only request (max_new_tokens 0), which has no output: there it
    is the whole prompt from position 0 (whose logprob is null), as SGLang's server answered when
    its frontend's select was written. That frontend scores each choice alone this way (token ids,
    prefill only, return_logprob, no logprob_start_len) and subtracts the entries position by
    position from the choice's conditional ones (unconditional_likelihood_normalized)."""
    if value is None or value == -1:
        return 0 if params.max_new_tokens == 0 else -1
    return value


def check_batch_size(size: int, max_prompts: int | None, param: str) -> None:
    if max_prompts is not None and size > max_prompts:
        raise CapacityExceeded(
            f"{param} holds {size} prompts; this server holds at most {max_prompts} in flight", param=param
        )


def _prompts(tokenize, text, input_ids, max_prompts: int | None = None) -> tuple[list[list[int]], bool]:
    if (text is None) == (input_ids is None):
        raise InvalidRequest("give exactly one of text and input_ids", param="text")
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise InvalidRequest("text must be a non-empty string or a non-empty list of them", param="text")
        check_batch_size(len(texts), max_prompts, "text")
        return [tokenize(t) for t in texts], not isinstance(text, str)
    is_batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
    batch = input_ids if is_batch else [input_ids]
    check_batch_size(len(batch), max_prompts, "input_ids")
    if not all(isinstance(ids, list) and ids and all(type(t) is int for t in ids) for ids in batch):
        raise InvalidRequest("input_ids must be a non-empty list of token ids, or a list of them", param="input_ids")
    return [list(ids) for ids in batch], is_batch


def _per_item(value, n: int, name: str, types: tuple) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise InvalidRequest(f"{name} has {len(value)} entries for {n} prompts", param=name)
        items = list(value)
    else:
        items = [value] * n
    for item in items:
        if not isinstance(item, types) or (isinstance(item, bool) and bool not in types):
            raise InvalidRequest(f"{name} has a value of the wrong type: {item!r}", param=name)
    return items


def _flag(value, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false", param=name)
    return value
