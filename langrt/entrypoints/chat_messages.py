"""/v1/chat/completions' messages -> the prompt's token ids, through the chat template.

Messages follow OpenAI's shapes: system / developer / user / assistant / tool, content as a
string or text parts, an assistant's `tool_calls` (arguments as JSON text) and a tool's
`tool_call_id`. A template that renders tools gets them (and the calls and results) as HF
templates expect; one that does not gets them written into the messages (tool_calls.py).
"""

from __future__ import annotations

import json

from langrt.entrypoints.tool_calls import ToolRequest, describe_tools, template_renders_tools
from langrt.entrypoints.tool_parser import HERMES
from langrt.errors import InvalidRequest

_ROLES = ("system", "developer", "user", "assistant", "tool")


def chat_prompt(
    manager,
    template: str | None,
    messages,
    tools: ToolRequest | None,
    template_kwargs: dict | None = None,
    continue_final: bool = False,
) -> list[int]:
    """`template_kwargs`: more variables for the template (chat_template_kwargs, checked).
    `continue_final`: the last message, an assistant's, is left open for the output to continue
    (no generation prompt after it), as vLLM's and SGLang's `continue_final_message`."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    if len(messages) >= manager.ready.context_len:  # each message is at least one token
        raise InvalidRequest(
            f"{len(messages)} messages cannot fit the context of {manager.ready.context_len} tokens", param="messages"
        )
    normalized = [_message(m) for m in messages]
    chars = sum(len(m["content"]) + len(json.dumps(m.get("tool_calls", ""))) for m in normalized)
    if tools is not None:
        chars += len(json.dumps(tools.tools))
    if chars > manager.max_prompt_chars:  # before the template renders and the tokenizer runs
        raise InvalidRequest(f"the messages hold {chars} characters, more than the context can hold", param="messages")
    if template is None:
        raise InvalidRequest(
            "this model has no chat template; use /v1/completions or --chat-template", param="messages"
        )
    if continue_final and normalized[-1]["role"] != "assistant":
        raise InvalidRequest(
            "continue_final_message needs the last message to be the assistant's", param="continue_final_message"
        )
    extra = dict(template_kwargs or {})
    if template_renders_tools(template):
        if tools is not None:
            extra["tools"] = tools.tools
    else:
        normalized = _written_out(normalized, tools)
    try:
        text = manager.tokenizer.apply_chat_template(
            normalized,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=not continue_final,
            continue_final_message=continue_final,
            **extra,
        )
    except Exception as e:  # jinja errors: the template refused these messages
        raise InvalidRequest(f"the chat template rejected the messages: {e}", param="messages") from e
    return manager.tokenize(text, add_special_tokens=False, param="messages")


def _message(m) -> dict:
    if not isinstance(m, dict) or m.get("role") not in _ROLES:
        raise InvalidRequest(
            "each message needs a role of system, developer, user, assistant or tool", param="messages"
        )
    role = "system" if m["role"] == "developer" else m["role"]
    calls = m.get("tool_calls") if role == "assistant" else None
    content = m.get("content")
    out = {"role": role, "content": "" if content is None and (calls or role == "assistant") else _content(content)}
    if calls:
        out["tool_calls"] = [_call(c) for c in calls] if isinstance(calls, list) else _bad_call()
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise InvalidRequest("a tool message needs the tool_call_id it answers", param="messages")
        out["tool_call_id"] = m["tool_call_id"]
    return out


def _content(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise InvalidRequest(
        "message content must be a string or a list of text parts (this model is text-only)", param="messages"
    )


def _call(call) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        _bad_call()
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        raise InvalidRequest("a tool call's arguments must be a JSON text", param="messages") from None
    return {"id": call.get("id"), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _bad_call():
    raise InvalidRequest(
        'tool_calls must be a list of {"id", "type": "function", "function": {"name", "arguments"}}', param="messages"
    )


def _written_out(messages: list[dict], tools: ToolRequest | None) -> list[dict]:
    """For a template that renders no tools: the tools in the system message, calls in the
    assistant's text, results as a user turn (hermes syntax, which Qwen2.5 templates write)."""
    out: list[dict] = []
    if tools is not None:
        if messages[0]["role"] == "system":
            messages = [
                {"role": "system", "content": messages[0]["content"] + "\n\n" + describe_tools(tools)},
                *messages[1:],
            ]
        else:
            out.append({"role": "system", "content": describe_tools(tools)})
    for m in messages:
        if m["role"] == "tool":
            result = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("tool_results"):  # consecutive results: one turn
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
        elif m.get("tool_calls"):
            calls = [
                HERMES.begin(c["function"]["name"])
                + json.dumps(c["function"]["arguments"], ensure_ascii=False)
                + HERMES.end
                for c in m["tool_calls"]
            ]
            text = "\n".join(([m["content"]] if m["content"] else []) + calls)
            out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return [{"role": m["role"], "content": m["content"]} for m in out]
