"""Regexes of property names, for objects whose keys are not all listed by the schema."""

from __future__ import annotations

from langrt.constrained.json_schema import regex as rx


def key_not_in(names: list[str]) -> str:
    """A property name (raw characters, no escapes) that is none of `names`."""
    if not names:
        return rx.JSON_STRING
    raw = [(0x20, 0x21), (0x23, 0x5B), (0x5D, rx.MAX_CP)]
    end = object()
    trie: dict = {}
    for name in names:
        if all(c >= " " and c not in '"\\' for c in name):
            node = trie
            for c in name:
                node = node.setdefault(c, {})
            node[end] = True
    any_raw = rx.char_class(rx.normalize(raw)) + "*"

    def not_in(node: dict) -> str:
        chars = [c for c in node if c is not end]
        parts = [] if end in node else [""]
        others = rx.intersect(raw, rx.complement([(ord(c), ord(c)) for c in chars]))
        parts.append(rx.seq(rx.char_class(others), any_raw))
        parts += [rx.escape(c) + not_in(node[c]) for c in chars]
        return rx.alt(parts)

    return '"' + not_in(trie) + '"'
