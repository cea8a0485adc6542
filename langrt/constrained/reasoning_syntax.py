"""The reasoning parsers' syntax (`--reasoning-parser`, SGLang's names): the tags around a model's
thinking and the chat template flag that turns it off.

It sits below both of its readers: the chat layer that splits an output into reasoning and answer
(langrt/entrypoints/reasoning_parser.py) and the grammar that lets a constrained request think
first (langrt/constrained/reasoning.py), which needs the end tag's token.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningSyntax:
    name: str
    start: str  # the tag opening the thinking
    end: str  # the tag ending it (one token in the model's vocabulary)
    thinking_switch: str | None  # the chat template flag that turns thinking off (None: always on)

    def thinks(self, template_kwargs: dict) -> bool:
        """Whether a request whose template gets `template_kwargs` starts its output thinking."""
        return self.thinking_switch is None or template_kwargs.get(self.thinking_switch, True) is not False


PARSERS = {
    "qwen3": ReasoningSyntax("qwen3", "<think>", "</think>", "enable_thinking"),
    "deepseek-r1": ReasoningSyntax("deepseek-r1", "<think>", "</think>", None),
}


def reasoning_syntax(name: str) -> ReasoningSyntax:
    syntax = PARSERS.get(name)
    if syntax is None:
        raise ValueError(f"--reasoning-parser must be one of {', '.join(PARSERS)}; got {name!r}")
    return syntax
