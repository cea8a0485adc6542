"""Reasoning models' outputs split into their thinking and their answer (`--reasoning-parser`,
SGLang's names): `<think>thinking</think>answer` -> reasoning_content "thinking", content
"answer".

- `qwen3`: Qwen3's hybrid models think unless the chat template's `enable_thinking` is false
  (then the template itself closes an empty `<think></think>` in the prompt).
- `deepseek-r1`: DeepSeek-R1 and its distills always think; their templates open `<think>` in
  the prompt, so the output may hold only the end tag.

A thinking output counts as reasoning until the end tag, whether or not the start tag opens it;
one that does not think is all answer unless it opens with the start tag. The text is split as
it grows (streaming) with the same result as splitting it whole: a tag cut across two chunks is
held back until it is whole, and the whitespace around the tags is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from langrt.constrained.reasoning_syntax import ReasoningSyntax


@dataclass
class ReasoningStream:
    """Splits one output as its text grows: `feed(text_so_far, final)` returns the reasoning
    added since the last call; `content` is the answer so far (it only grows). With
    `stream_reasoning` False the reasoning comes in one piece, when it ends (or at the end).

    Both parts are recomputed from the text each time (their ends stripped of whitespace, a
    partial end tag held back), so each only grows and the pieces add up to the whole split."""

    syntax: ReasoningSyntax
    thinking: bool  # the output starts in its thinking (the start tag is optional then)
    stream_reasoning: bool = True
    reasoning: str = ""
    content: str = ""
    _phase: str = "start"  # start (the text may yet open with the tag) | reasoning | content
    _from: int = 0  # where the current phase's text begins
    _after_end: bool = False  # the answer follows the end tag (its leading whitespace dropped)
    _sent: int = 0  # of `reasoning`, returned by feed so far

    def feed(self, text: str, final: bool = False) -> str:
        if self._phase == "start":
            self._open(text, final)
        if self._phase == "reasoning":
            self._think(text, final)
        if self._phase == "content":
            answer = text[self._from :]
            self.content = answer.lstrip() if self._after_end else answer
        return self._release(final)

    def _open(self, text: str, final: bool) -> None:
        """Decide whether the output opens with the start tag (stripped), once enough is seen."""
        rest = text.lstrip()
        if rest.startswith(self.syntax.start):
            self._phase, self._from = "reasoning", len(text) - len(rest) + len(self.syntax.start)
        elif final or not self.syntax.start.startswith(rest):
            self._phase = "reasoning" if self.thinking else "content"
        # else: the tag may still be arriving

    def _think(self, text: str, final: bool) -> None:
        end = text.find(self.syntax.end, self._from)
        upto = end if end >= 0 else len(text) if final else _before_partial_tag(text, self._from, self.syntax.end)
        self.reasoning = text[self._from : upto].strip()
        if end >= 0:
            self._phase, self._from, self._after_end = "content", end + len(self.syntax.end), True

    def _release(self, final: bool) -> str:
        if not self.stream_reasoning and self._phase == "reasoning" and not final:
            return ""
        out = self.reasoning[self._sent :]
        self._sent = len(self.reasoning)
        return out


def _before_partial_tag(text: str, start: int, tag: str) -> int:
    """Where text[start:] stops being surely free of `tag`: before a suffix that may be the
    tag's beginning."""
    for n in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if tag.startswith(text[len(text) - n :]):
            return len(text) - n
    return len(text)


def split_reasoning(text: str, syntax: ReasoningSyntax, thinking: bool) -> tuple[str, str]:
    """(reasoning, answer) of a whole output."""
    stream = ReasoningStream(syntax, thinking)
    stream.feed(text, final=True)
    return stream.reasoning, stream.content
