"""Regexes of property names, for objects whose keys are not all listed by the schema."""

from __future__ import annotations

from langrt.constrained.json_schema import regex as rx


def key_not_in(names: list[str], prefixes: list[str] = ()) -> str | None:
    """A property name (raw characters, no escapes) that is none of `names` and starts with
    none of `prefixes` (None if there is no such name)."""
    if not names and not prefixes:
        return rx.JSON_STRING
    raw = rx.normalize([(0x20, 0x21), (0x23, 0x5B), (0x5D, rx.MAX_CP)])
    end, below = object(), object()
    trie: dict = {}
    for text, mark in [(n, end) for n in names] + [(p, below) for p in prefixes]:
        if all(c >= " " and c not in '"\\' for c in text):
            node = trie
            for c in text:
                node = node.setdefault(c, {})
            node[mark] = True
    any_raw = rx.char_class(rx.normalize(raw)) + "*"

    def not_in(node: dict) -> str | None:
        if below in node:
            return None  # every name from here starts with a prefix
        chars = [c for c in node if c is not end]
        parts = [] if end in node else [""]
        others = rx.without(raw, [ord(c) for c in chars])
        parts.append(rx.seq(rx.char_class(others), any_raw))
        parts += [rx.seq(rx.escape(c), not_in(node[c])) for c in chars]
        return rx.alt(parts)

    return rx.seq('"', not_in(trie), '"')
