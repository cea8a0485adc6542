"""OpenAI tool calling's pieces without a server: the request's tools checked, the syntax a
template teaches, the prompt each kind of template renders, the constraint, and the parser that
gives the same calls streamed (any split of the text) as whole."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from langrt.entrypoints.chat_messages import chat_prompt
from langrt.entrypoints.tool_calls import constraint, parse_tools, syntax_for
from langrt.entrypoints.tool_parser import HERMES, LLAMA3, ToolCallParser
from langrt.errors import InvalidRequest

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now"}}
TWO_TURNS = [
    {"role": "user", "content": "Add 2 and 3"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
]


def split_feed(syntax, text: str, pieces: int, seed: int = 0):
    """Feed `text` in `pieces` growing prefixes; (content, [(name, arguments)]) reassembled."""
    parser = ToolCallParser(syntax)
    cuts = sorted(random.Random(seed).sample(range(1, len(text)), min(pieces, len(text) - 1))) + [len(text)]
    content, calls = "", {}
    for cut in cuts:
        update = parser.feed(text[:cut], final=cut == len(text))
        content += update.content
        for index, part in update.calls.items():
            call = calls.setdefault(index, ["", ""])
            call[0] += part.get("name", "")
            call[1] += part.get("arguments", "")
    return content, [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize(
    "syntax, text, content, calls",
    [
        (HERMES, 'Sure. <tool_call>\n{"name": "add", "arguments": {"a": [1, {"x": "}"}], "b": 2}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
         "Sure.", [("add", '{"a": [1, {"x": "}"}], "b": 2}'), ("now", "{}")]),
        (HERMES, "plain text < with <tool stuff\n", "plain text < with <tool stuff\n", []),
        (HERMES, '  Hi there.  ', "  Hi there.  ", []),
        (HERMES, 'before <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call> after', "before after", [("f", '{"x": 1}')]),
        (HERMES, '<tool_call>\n{"name": "f", "arguments": {"x": "cut off', "", [("f", '{"x": "cut off')]),
        (HERMES, 'Hm. <tool_call>\n{"name": "f", "argu', "Hm.", []),  # cut before its arguments: dropped
        (HERMES, HERMES.begin("f") + "{}" + HERMES.end + "\n<tool_", "", [("f", "{}")]),
        (HERMES, 'Hm. <tool_call> is my favourite tag', "Hm. <tool_call> is my favourite tag", []),
        (LLAMA3, '{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {"y": [2]}}', "", [("f", '{"x": 1}'), ("g", '{"y": [2]}')]),
        (LLAMA3, 'Some {text} then {"name": "f", "parameters": {"q": "{"}}', "Some {text} then", [("f", '{"q": "{"}')]),
    ],
)  # fmt: skip
def test_streamed_calls_equal_the_whole_text_parse(syntax, text, content, calls):
    assert split_feed(syntax, text, 0) == (content, calls)
    for pieces in range(1, 30):
        assert split_feed(syntax, text, pieces, seed=pieces) == (content, calls)


def test_each_call_has_its_own_id():
    parser = ToolCallParser(HERMES)
    parser.feed(HERMES.begin("a") + "{}" + HERMES.end + "\n" + HERMES.begin("b") + "{}" + HERMES.end, final=True)
    ids = [c.id for c in parser.calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"tool_choice": "auto"}, "tool_choice needs tools"),
        ({"tools": []}, "list of 1 to"),
        ({"tools": [{"type": "code"}]}, "each tool must be"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "function name"),
        ({"tools": [ADD, ADD]}, "same function twice"),
        ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "sub"}}}, "not among the tools"),
        ({"tools": [ADD], "tool_choice": "sometimes"}, "tool_choice must be"),
        ({"tools": [ADD], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "parameters must be"),
    ],
)
def test_bad_tool_settings_are_refused(body, words):
    with pytest.raises(InvalidRequest, match=words):
        parse_tools(body)


def test_the_constraint_follows_tool_choice():
    auto = constraint(parse_tools({"tools": [ADD, NOW]}), HERMES)
    assert auto["triggers"] == ["<tool_call>"] and "free_text" not in auto and auto["max_tags"] is None
    assert [s["begin"] for s in auto["structures"]] == [HERMES.begin("add"), HERMES.begin("now")]
    assert auto["structures"][1]["schema"] == {"type": "object", "properties": {}}
    required = constraint(
        parse_tools({"tools": [ADD, NOW], "tool_choice": "required", "parallel_tool_calls": False}), LLAMA3
    )
    assert required["free_text"] is False and required["separator"] == "; " and required["max_tags"] == 1
    named = constraint(
        parse_tools({"tools": [ADD, NOW], "tool_choice": {"type": "function", "function": {"name": "now"}}}), HERMES
    )
    assert [s["begin"] for s in named["structures"]] == [HERMES.begin("now")] and named["max_tags"] == 1
    assert constraint(parse_tools({"tools": [ADD], "tool_choice": "none"}), HERMES) is None


@pytest.fixture(scope="module")
def manager(smollm_path):
    from langrt.tokenizer.loader import load_tokenizer

    tokenizer = load_tokenizer(smollm_path)
    return SimpleNamespace(
        tokenizer=tokenizer,
        ready=SimpleNamespace(context_len=8192),
        max_prompt_chars=10**6,
        tokenize=lambda text, add_special_tokens, param: tokenizer.encode(text, add_special_tokens=add_special_tokens),
    )


def rendered(manager, template: str, messages, tools) -> str:
    return manager.tokenizer.decode(chat_prompt(manager, template, messages, tools))


def test_a_template_without_tools_gets_them_written_in(manager):
    template = manager.tokenizer.chat_template
    assert syntax_for(template) is HERMES
    text = rendered(manager, template, TWO_TURNS, parse_tools({"tools": [ADD]}))
    assert "<tools>\n" + json.dumps(ADD) + "\n</tools>" in text  # in the system turn, before the user's
    assert text.index("<tools>") < text.index("Add 2 and 3")
    assert HERMES.begin("add") + '{"a": 2, "b": 3}' + HERMES.end in text
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>" in text


@pytest.mark.parametrize("name, syntax", [("hermes_tools", HERMES), ("llama3_tools", LLAMA3)])
def test_templates_that_render_tools_get_them(manager, name, syntax):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    assert syntax_for(template) is syntax
    text = rendered(manager, template, TWO_TURNS, parse_tools({"tools": [ADD]}))
    assert json.dumps(ADD) in text
    assert syntax.begin("add").lstrip("<tool_call>\n") + '{"a": 2, "b": 3}}' in text
    assert "5" in text.split("Add 2 and 3")[1]


@pytest.mark.parametrize(
    "message, words",
    [
        ({"role": "tool", "content": "5"}, "tool_call_id"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": "{not json"}}]}, "JSON text"),
        ({"role": "assistant", "tool_calls": "add"}, "tool_calls must be"),
        ({"role": "function", "content": "x"}, "role of"),
    ],
)
def test_bad_messages_are_refused(manager, message, words):
    with pytest.raises(InvalidRequest, match=words):
        chat_prompt(manager, manager.tokenizer.chat_template, [{"role": "user", "content": "hi"}, message], None)
