"""Tool calls out of a chat model's text, as it grows: the same parser serves a streamed reply
(events per update) and a whole one (all events at once), so both give the same calls.

Two syntaxes, the ones chat templates teach their models:
  hermes (Qwen2/2.5, Hermes, and langrt's own for templates without tools):
      <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>
  llama3 (Llama 3.1/3.2 JSON tool calling):
      {"name": "f", "parameters": {...}}      calls separated by "; "
Text around the calls is the message's content. A call's `arguments` are the model's own JSON
text (streamed as it is written when it is an object or array).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

import regex


@dataclass(frozen=True)
class ToolSyntax:
    name: str
    trigger: str  # the text that opens a call
    header: re.Pattern  # from the trigger to the first character of the arguments; group 1 the name
    key: str  # the arguments' key in the call object
    close: re.Pattern  # after the arguments, to the call's end
    separator: str  # between calls (constrained output)
    between: str  # characters that may sit between calls (dropped there)

    def begin(self, function: str) -> str:
        """A call's text up to its arguments, as the constraint writes it."""
        opening = "<tool_call>\n" if self.name == "hermes" else ""
        return f'{opening}{{"name": {json.dumps(function)}, "{self.key}": '

    @property
    def end(self) -> str:
        return "}\n</tool_call>" if self.name == "hermes" else "}"


_NAME = r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"'
HERMES = ToolSyntax(
    "hermes",
    "<tool_call>",
    re.compile(r"<tool_call>\s*" + _NAME + r'arguments"\s*:\s*'),
    "arguments",
    re.compile(r"\s*\}\s*</tool_call>"),
    "\n",
    " \t\r\n",
)
LLAMA3 = ToolSyntax(
    "llama3",
    '{"name": ',
    re.compile(_NAME + r'(?:parameters|arguments)"\s*:\s*'),
    "parameters",
    re.compile(r"\s*\}"),
    "; ",
    " \t\r\n;",
)
SYNTAXES = {s.name: s for s in (HERMES, LLAMA3)}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""
    sent: int = 0  # characters of arguments already streamed
    complete: bool = False  # its end was read (a call cut short by the token limit is not)


@dataclass
class Update:
    """What one call of ToolCallParser.feed found: content text, and per call index the parts
    that are new (name on the first appearance, arguments text)."""

    content: str = ""
    calls: dict[int, dict] = field(default_factory=dict)


class ToolCallParser:
    def __init__(self, syntax: ToolSyntax):
        self.syntax = syntax
        self.calls: list[ToolCall] = []
        self.content = ""
        self._pos = 0  # text before this is consumed
        self._mode = "text"  # text | call | after (between a call and what follows it)
        self._args_at: int | None = None  # where the open call's arguments start
        self._blank = ""  # whitespace held: dropped where a call follows it

    def feed(self, text: str, final: bool) -> Update:
        """Consume the (cumulative) text; `final` when no more will come."""
        update = Update()
        while self._step(text, final, update):
            pass
        if final and self._blank and not self.calls:  # a reply of text only keeps all of it
            self._say(update, self._blank)
        if final:
            self._blank = ""
        return update

    def _step(self, text: str, final: bool, update: Update) -> bool:
        """One move of the state machine; False when it must wait for more text."""
        if self._mode == "text":
            return self._in_text(text, final, update)
        if self._mode == "call":
            return self._in_call(text, final, update)
        return self._after_call(text, final)

    def _in_text(self, text: str, final: bool, update: Update) -> bool:
        found = text.find(self.syntax.trigger, self._pos)
        if found >= 0:
            self._content(update, text[self._pos : found])
            self._pos, self._mode = found, "call"
            return True
        safe = len(text) if final else len(text) - _partial_suffix(text, self._pos, self.syntax.trigger)
        self._content(update, text[self._pos : safe])
        self._pos = safe
        return False

    def _in_call(self, text: str, final: bool, update: Update) -> bool:
        header = self.syntax.header.match(text, self._pos)
        if header is None:
            if final:  # a call cut short (by the token limit) is dropped; anything else is text
                if _partial_header(self.syntax, text[self._pos :]) is None:
                    self._content(update, text[self._pos :])
                else:
                    self._blank = ""
                self._pos, self._mode = len(text), "text"
            return False
        if self._args_at is None:
            self._blank = ""  # whitespace right before a call is the call's layout, not content
            self.calls.append(ToolCall(new_call_id(), json.loads(f'"{header.group(1)}"')))
            update.calls[len(self.calls) - 1] = {"id": self.calls[-1].id, "name": self.calls[-1].name}
        self._args_at = header.end()
        end = _value_end(text, self._args_at)
        closing = self.syntax.close.match(text, end) if end is not None else None
        arguments = text[self._args_at : len(text) if end is None else end]
        if closing is None and not final:
            if arguments[:1] in ("{", "["):  # a container: all of it so far is the arguments' start
                self._arguments(update, arguments)
            return False
        self._arguments(update, arguments)
        self.calls[-1].complete = closing is not None
        self._pos = closing.end() if closing is not None else len(text)
        self._mode, self._args_at = "after", None
        return True

    def _after_call(self, text: str, final: bool) -> bool:
        stop = self._pos
        while stop < len(text) and text[stop] in self.syntax.between:
            stop += 1
        rest = text[stop:]
        if not final and (not rest or self.syntax.trigger.startswith(rest)):
            return False  # separators, perhaps before another call
        if rest.startswith(self.syntax.trigger) or self.syntax.trigger.startswith(rest):
            self._pos = stop  # separators between calls, or trailing ones (and a call cut short): not content
            if not rest.startswith(self.syntax.trigger):
                self._pos = len(text)
        self._mode = "text"
        return True

    def _content(self, update: Update, text: str) -> None:
        """Text outside calls. Trailing whitespace is held back: dropped where a call follows,
        said when more text does."""
        held = self._blank + text
        body = held.rstrip()
        self._blank = held[len(body) :]
        self._say(update, body)

    def _say(self, update: Update, text: str) -> None:
        self.content += text
        update.content += text

    def _arguments(self, update: Update, arguments: str) -> None:
        call = self.calls[-1]
        call.arguments = arguments
        new = arguments[call.sent :]
        if new:
            update.calls.setdefault(len(self.calls) - 1, {})["arguments"] = new
            call.sent = len(arguments)


def _partial_suffix(text: str, start: int, trigger: str) -> int:
    """The length of the longest end of text[start:] that begins `trigger` (held back: it may
    become a call)."""
    for n in range(min(len(trigger) - 1, len(text) - start), 0, -1):
        if trigger.startswith(text[len(text) - n :]):
            return n
    return 0


def _partial_header(syntax: ToolSyntax, text: str):
    """A match if `text` may still grow into a call's header (the `regex` module's partial match)."""
    return regex.match(syntax.header.pattern, text, partial=True)


_DECODER = json.JSONDecoder()


def _value_end(text: str, start: int) -> int | None:
    """Where the JSON value starting at `start` ends, None while it is incomplete."""
    try:
        _, end = _DECODER.raw_decode(text, start)
    except ValueError:
        return None
    return end
