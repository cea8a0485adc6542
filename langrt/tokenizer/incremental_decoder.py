"""Incremental detokenization: the text of a growing list of token ids, a few ids at a time.

Decoding token by token is wrong in two ways: a character split across byte-level tokens decodes
to U+FFFD until its last byte arrives, and SentencePiece tokenizers drop a word's leading space
when it starts the decoded run. So each step decodes a short window: ids from `prefix_offset`
(already emitted context, seeded with the prompt's tail) to the end, and emits only the text past
the context's own decoding, holding back output that still ends in an incomplete character.
"""

from __future__ import annotations

from typing import Sequence

# Prompt tokens kept as left context, so the first output token decodes with its leading space.
CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDecoder:
    def __init__(
        self,
        tokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ):
        self.tokenizer = tokenizer
        self.decode_kwargs = dict(
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )
        self.ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0  # start of the decode window (context for the next emission)
        self.read_offset = len(self.ids)  # ids before this have been emitted as text
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, **self.decode_kwargs) if ids else ""

    def push(self, new_ids: Sequence[int]) -> str:
        """Add token ids; return the text that became final (possibly empty), also appended to `text`."""
        self.ids.extend(new_ids)
        context = self._decode(self.ids[self.prefix_offset : self.read_offset])
        window = self._decode(self.ids[self.prefix_offset :])
        if len(window) <= len(context) or window.endswith(REPLACEMENT_CHAR):
            return ""
        delta = window[len(context) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of generation: emit whatever is held back, incomplete characters included."""
        context = self._decode(self.ids[self.prefix_offset : self.read_offset])
        window = self._decode(self.ids[self.prefix_offset :])
        delta = window[len(context) :] if window.startswith(context) else ""
        self.prefix_offset = self.read_offset = len(self.ids)
        self.text += delta
        return delta
