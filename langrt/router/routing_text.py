"""The text a request is routed by: the prompt as the worker will see it, near enough.

The router has no tokenizer and applies no chat template; it needs only text whose prefixes
are shared where the workers' token prefixes are: the native API's `text` (or its token ids
spelled out), the OpenAI `prompt`, or a chat's messages joined in order with their roles.
Batches route by their first prompt (a batch goes to one worker).
"""

from __future__ import annotations

from typing import Any


def routing_text(path: str, body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    if path == "/v1/chat/completions":
        return _chat_text(body.get("messages"))
    if path == "/v1/completions":
        return _first_prompt(body.get("prompt"))
    if body.get("text") is not None:
        return _first_prompt(body["text"])
    return _first_prompt(body.get("input_ids"))


def is_stream(body: Any) -> bool:
    return isinstance(body, dict) and body.get("stream") is True


def _first_prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):  # one prompt of token ids
            return " ".join(map(str, prompt))
        return _first_prompt(prompt[0])
    return ""


def _chat_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        if isinstance(message, dict):
            parts.append(f"<{message.get('role')}>{_content_text(message.get('content'))}")
    return "".join(parts)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: only the text ones matter for the prefix
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
