"""/v1/chat/completions for reasoning models (`--reasoning-parser`): the request's switches, as
SGLang takes them, and the thinking split out of the answer as `message.reasoning_content`
(streamed as `delta.reasoning_content`, apart from `delta.content`).

- `chat_template_kwargs`: passed to the chat template (`{"enable_thinking": false}` turns a
  Qwen3 model's thinking off); accepted with or without a parser.
- `separate_reasoning` (default true): false leaves the thinking inside `content`.
- `stream_reasoning` (default true): false sends the thinking in one chunk when it ends.
- `max_reasoning_tokens`: thinking tokens before the end-of-thinking token is forced.

A thinking request's grammar (response_format, regex, tool calls) applies after the thinking
(constrained/reasoning.py), whether or not the thinking is separated in the response.
"""

from __future__ import annotations

from dataclasses import dataclass

from langrt.constrained.reasoning_syntax import ReasoningSyntax, reasoning_syntax
from langrt.entrypoints.reasoning_parser import ReasoningStream
from langrt.errors import InvalidRequest

FIELDS = {"chat_template_kwargs", "separate_reasoning", "stream_reasoning", "max_reasoning_tokens"}
# apply_chat_template's own arguments: a template variable by one of these names would change
# how the prompt is built rather than what the template sees
_RESERVED = {
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
}


@dataclass(frozen=True)
class ReasoningRequest:
    syntax: ReasoningSyntax
    thinking: bool  # the output opens with thinking (the template did not turn it off)
    separate: bool  # split it out as reasoning_content
    stream_reasoning: bool

    def stream(self) -> ReasoningStream | None:
        """A fresh splitter for one choice's text (None: the text is all content)."""
        return ReasoningStream(self.syntax, self.thinking, self.stream_reasoning) if self.separate else None


def template_kwargs(body: dict) -> dict:
    """The request's chat_template_kwargs, checked: an object of template variables."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise InvalidRequest(
            "chat_template_kwargs must be an object of template variables", param="chat_template_kwargs"
        )
    reserved = sorted(_RESERVED & set(kwargs))
    if reserved:
        raise InvalidRequest(
            f"chat_template_kwargs may not set {', '.join(reserved)} (the server sets how the prompt is built)",
            param="chat_template_kwargs",
        )
    return kwargs


def reasoning_request(body: dict, parser: str | None, kwargs: dict) -> ReasoningRequest | None:
    """The request's reasoning settings on a server with `parser` (None: without one, where
    asking for them is a 400)."""
    for name in ("separate_reasoning", "stream_reasoning"):
        if not isinstance(body.get(name, True), bool):
            raise InvalidRequest(f"{name} must be a boolean", param=name)
    if parser is None:
        if body.get("max_reasoning_tokens") is not None:
            raise InvalidRequest(
                "max_reasoning_tokens needs a server started with --reasoning-parser", param="max_reasoning_tokens"
            )
        return None
    syntax = reasoning_syntax(parser)
    return ReasoningRequest(
        syntax, syntax.thinks(kwargs), body.get("separate_reasoning", True), body.get("stream_reasoning", True)
    )


def apply_reasoning(sampling: dict, reasoning: ReasoningRequest | None, body: dict) -> None:
    """The sampling parameters of a thinking request: its grammar after the thinking, and the
    thinking's budget (SamplingParams checks it)."""
    if reasoning is None or not reasoning.thinking:
        if body.get("max_reasoning_tokens") is not None:
            raise InvalidRequest(
                "max_reasoning_tokens needs thinking on (chat_template_kwargs turned it off)",
                param="max_reasoning_tokens",
            )
        return
    sampling["reasoning"] = True
    if body.get("max_reasoning_tokens") is not None:
        sampling["max_reasoning_tokens"] = body["max_reasoning_tokens"]


def split_text(reasoning: ReasoningRequest | None, text: str) -> tuple[str | None, str]:
    """(reasoning_content, content) of a whole output; reasoning_content None where not split
    (or empty)."""
    stream = reasoning.stream() if reasoning is not None else None
    if stream is None:
        return None, text
    stream.feed(text, final=True)
    return stream.reasoning or None, stream.content


def message_fields(reasoning: ReasoningRequest | None, thought: str | None) -> dict:
    """What a message carries besides content: reasoning_content where the server splits it."""
    return {} if reasoning is None or not reasoning.separate else {"reasoning_content": thought}
