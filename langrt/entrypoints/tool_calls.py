"""OpenAI tool calling on /v1/chat/completions: the request's `tools`, `tool_choice` and
`parallel_tool_calls`, how the chat template is told of them, and the constraint that keeps a
call's arguments valid.

The syntax of a call is the one the template teaches (tool_parser.py: hermes or llama3). A
template that does not render tools at all (the built-in SmolLM2's) gets them described in the
system message in the hermes syntax, and tool results as user turns in `<tool_response>`.

Every call the model writes is constrained by a structural tag (constrained/structural_tag.py)
whose tags are the functions: `{"name": "f", "arguments": ` + JSON valid against f's parameters
+ the call's end. With `auto` the tags sit in free text (the model may answer in words); with
`required` or a named function the output is calls only, at least one (one with a named
function, or when parallel_tool_calls is false).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from langrt.entrypoints.tool_parser import HERMES, LLAMA3, ToolSyntax
from langrt.errors import InvalidRequest

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
MAX_TOOLS = 128  # OpenAI's limit
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict]  # the request's tools, each {"type": "function", "function": {...}}
    choice: str  # none | auto | required | named
    named: str | None  # the function tool_choice names
    parallel: bool

    @property
    def functions(self) -> list[dict]:
        return [t["function"] for t in self.tools]


def parse_tools(body: dict) -> ToolRequest | None:
    """The request's tool settings, checked (InvalidRequest naming the field); None without tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise InvalidRequest("tool_choice needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list) or not 0 < len(tools) <= MAX_TOOLS:
        raise InvalidRequest(f"tools must be a list of 1 to {MAX_TOOLS} tools", param="tools")
    checked = [_tool(t) for t in tools]
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) < len(names):
        raise InvalidRequest("tools name the same function twice", param="tools")
    kind, named = _choice(choice, names)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidRequest("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    return ToolRequest(checked, kind, named, parallel)


def _tool(tool) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise InvalidRequest('each tool must be {"type": "function", "function": {...}}', param="tools")
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequest("a function name must be 1-64 letters, digits, '_' or '-'", param="tools")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = _EMPTY_PARAMETERS
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"function {name}: parameters must be a JSON schema object", param="tools")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"function {name}: description must be a string", param="tools")
    out = {"name": name, **({} if description is None else {"description": description}), "parameters": parameters}
    return {"type": "function", "function": out}


def _choice(choice, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise InvalidRequest(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
        return "named", name
    raise InvalidRequest(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
        param="tool_choice",
    )


# ---- the template ---------------------------------------------------------------------------------


def template_renders_tools(template: str) -> bool:
    return "tools" in template


def syntax_for(template: str) -> ToolSyntax:
    """The call syntax the template teaches: llama3's JSON where it writes `"parameters"` calls or
    Llama's python tag, else hermes (also langrt's own for templates that know no tools)."""
    if template_renders_tools(template) and "<tool_call>" not in template:
        if "<|python_tag|>" in template or '"parameters": ' in template or "<|eom_id|>" in template:
            return LLAMA3
    return HERMES


def constraint(request: ToolRequest, syntax: ToolSyntax) -> dict | None:
    """The structural tag the reply follows (None for tool_choice none)."""
    if request.choice == "none":
        return None
    functions = [f for f in request.functions if request.choice != "named" or f["name"] == request.named]
    structures = [{"begin": syntax.begin(f["name"]), "schema": f["parameters"], "end": syntax.end} for f in functions]
    one = request.choice == "named" or not request.parallel
    tag = {"structures": structures, "triggers": [syntax.trigger], "max_tags": 1 if one else None}
    if request.choice != "auto":
        tag.update(free_text=False, separator=syntax.separator)
    return tag


def describe_tools(request: ToolRequest) -> str:
    """The tools in the hermes syntax, for a system message (templates that render no tools)."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in request.tools)
    return (
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
