"""SGLang's `structural_tag` format: free text in which tagged regions follow JSON schemas.

    {"type": "structural_tag",
     "structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}],
     "triggers": ["<function="]}

The free text may hold a trigger only where a tag begins: once the model writes `<function=` it
must go on with one of the structures whose `begin` starts with that trigger, then JSON valid
against the structure's schema, then its `end`, and free text again. Tool calling (entrypoints/
tool_calls.py) uses two more keys, langrt's own: `free_text: false` (the output is tags only,
at least one, joined by `separator`) and `max_tags` (at most that many tags).

The grammar is rules (cfg/rules.py): a start rule of the free text and the tags, calling each
schema's grammar, whose rules are renumbered behind it. Free text "without a trigger" is a
regex built from the triggers' Aho-Corasick automaton by state elimination (`avoiding`).
"""

from __future__ import annotations

import json
import re

from langrt.constrained.byte_dfa import CALL_BASE, MAX_RULES, call_marker
from langrt.constrained.cfg.rules import INLINE_MAX_CHARS, RuleSet
from langrt.constrained.json_schema.regex import char_class, complement, escape
from langrt.errors import InvalidRequest

PARAM = "structural_tag"
# Why: each trigger adds its length in automaton states to the free-text regex, and real formats
# use one or two short ones; past these the regex grows for nothing a tool format needs.
MAX_TRIGGERS = 16
MAX_TRIGGER_CHARS = 64
_KEYS = {"type", "structures", "triggers", "free_text", "separator", "max_tags"}


def canonical(value) -> str:
    """The structural tag (a dict or its JSON) checked and written in one canonical JSON form
    (the grammar cache's key). Raises InvalidRequest naming what is wrong."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise InvalidRequest(f"structural_tag is not valid JSON: {e}", param=PARAM) from None
    if not isinstance(value, dict):
        raise InvalidRequest("structural_tag must be an object with structures and triggers", param=PARAM)
    if "format" in value:
        raise InvalidRequest("structural_tag: only the structures/triggers form is supported, not format", param=PARAM)
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise InvalidRequest(f"structural_tag: unknown key(s) {', '.join(unknown)}", param=PARAM)
    structures = [_structure(s) for s in _list(value.get("structures"), "structures")]
    triggers = _triggers(value.get("triggers"), structures)
    free_text = value.get("free_text", True)
    separator = value.get("separator", "")
    max_tags = value.get("max_tags")
    if not isinstance(free_text, bool) or not isinstance(separator, str):
        raise InvalidRequest("structural_tag: free_text must be a boolean and separator a string", param=PARAM)
    if max_tags is not None and (type(max_tags) is not int or max_tags < 1):
        raise InvalidRequest("structural_tag: max_tags must be a positive integer", param=PARAM)
    spec = {
        "structures": structures,
        "triggers": triggers,
        "free_text": free_text,
        "separator": separator,
        "max_tags": max_tags,
    }
    return json.dumps(spec, sort_keys=True, ensure_ascii=False)


def _list(value, name: str) -> list:
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"structural_tag.{name} must be a non-empty list", param=PARAM)
    return value


def _structure(s) -> dict:
    if not isinstance(s, dict) or set(s) - {"begin", "schema", "end"}:
        raise InvalidRequest("structural_tag: each structure is {begin, schema, end}", param=PARAM)
    begin, end, schema = s.get("begin"), s.get("end"), s.get("schema", True)
    if not isinstance(begin, str) or not begin or not isinstance(end, str):
        raise InvalidRequest(
            "structural_tag: a structure's begin must be a non-empty string, end a string", param=PARAM
        )
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest("structural_tag: a structure's schema must be a JSON schema object", param=PARAM)
    return {"begin": begin, "schema": schema, "end": end}


def _triggers(value, structures: list[dict]) -> list[str]:
    triggers = _list(value, "triggers")
    if len(triggers) > MAX_TRIGGERS or not all(
        isinstance(t, str) and 0 < len(t) <= MAX_TRIGGER_CHARS for t in triggers
    ):
        raise InvalidRequest(
            f"structural_tag: triggers must be at most {MAX_TRIGGERS} non-empty strings of at most {MAX_TRIGGER_CHARS} characters",
            param=PARAM,
        )
    for s in structures:
        if not any(s["begin"].startswith(t) for t in triggers):
            raise InvalidRequest(f"structural_tag: the begin {s['begin']!r} starts with no trigger", param=PARAM)
    return sorted(set(triggers))


# ---- the grammar --------------------------------------------------------------------------------


def structural_tag_grammar(text: str, schema_grammar) -> str | RuleSet:
    """The grammar of a canonical structural tag: a regex, or rules. `schema_grammar(schema)` is
    the JSON-schema compiler (json_schema.schema_to_grammar, with the request's options)."""
    spec = json.loads(text)
    builder = _RuleBuilder()
    tags = "|".join(
        escape(s["begin"]) + builder.embed(schema_grammar(s["schema"])) + escape(s["end"]) for s in spec["structures"]
    )
    tag = f"(?:{tags})"
    more = "*" if spec["max_tags"] is None else "{0,%d}" % (spec["max_tags"] - 1)
    if spec["free_text"]:
        text_regex = avoiding(spec["triggers"])
        more = "*" if spec["max_tags"] is None else "{0,%d}" % spec["max_tags"]
        start = f"{text_regex}(?:{tag}{text_regex}){more}"
    else:
        start = f"{tag}(?:{escape(spec['separator'])}{tag}){more}"
    return builder.finish(start)


class _RuleBuilder:
    """A start rule calling other grammars: a small regex is copied in, rules are appended with
    their calls renumbered."""

    def __init__(self):
        self.names: list[str] = ["root"]
        self.bodies: list[str] = [""]

    def embed(self, source: str | RuleSet) -> str:
        if isinstance(source, str) and len(source) <= INLINE_MAX_CHARS:
            return f"(?:{source})"
        if isinstance(source, str):
            source = RuleSet(["schema"], [source])
        offset = len(self.bodies)
        if offset + len(source.bodies) > MAX_RULES:
            raise InvalidRequest("structural_tag: the schemas need too many grammar rules", param=PARAM)
        for name, body in zip(source.names, source.bodies):
            self.names.append(f"tag{offset}.{name}")
            self.bodies.append(shift_calls(body, offset))
        return call_marker(offset)

    def finish(self, start: str) -> str | RuleSet:
        if len(self.bodies) == 1:
            return start
        self.bodies[0] = start
        return RuleSet(self.names, self.bodies)


_ESCAPED_POINT = re.compile(r"(\\+)x\{([0-9A-Fa-f]+)\}")


def shift_calls(body: str, offset: int) -> str:
    """A rule body whose calls of rule i call rule i + offset (a `\\x{...}` escape is a call when
    an odd run of backslashes writes it and it names a call point)."""

    def shift(match: re.Match) -> str:
        slashes, point = match.group(1), int(match.group(2), 16)
        if len(slashes) % 2 == 0 or not CALL_BASE <= point < CALL_BASE + MAX_RULES:
            return match.group(0)
        return slashes[:-1] + call_marker(point - CALL_BASE + offset)

    return _ESCAPED_POINT.sub(shift, body)


# ---- free text without triggers -----------------------------------------------------------------


def avoiding(triggers: list[str]) -> str:
    """A regex of every text in which no trigger occurs: the triggers' Aho-Corasick automaton
    without its matching states, written as a regex by eliminating states (Brzozowski-McCluskey).
    Every state accepts (the text may end anywhere)."""
    edges, size = _automaton(triggers)
    final = size  # a new final state, reached from every state by the empty word
    paths: dict[tuple[int, int], str] = dict(edges)
    for state in range(size):
        paths[(state, final)] = ""
    for gone in range(size - 1, 0, -1):  # keep state 0 (the start)
        loop = paths.pop((gone, gone), None)
        ins = [(a, r) for (a, b), r in paths.items() if b == gone]
        outs = [(b, r) for (a, b), r in paths.items() if a == gone]
        for key in [k for k in paths if gone in k]:
            del paths[key]
        middle = "" if loop is None else f"(?:{loop})*"
        for a, into in ins:
            for b, out in outs:
                _union(paths, (a, b), _cat(into, middle, out))
    loop = paths.get((0, 0))
    head = "" if loop is None else f"(?:{loop})*"
    return head + _group(paths[(0, final)])


def _automaton(triggers: list[str]) -> tuple[dict[tuple[int, int], str], int]:
    """The Aho-Corasick automaton's edges between non-matching states as regexes {(a, b): r}
    (state 0 the start), and the number of states."""
    goto: list[dict[str, int]] = [{}]
    matched = [False]
    for trigger in triggers:
        state = 0
        for c in trigger:
            if c not in goto[state]:
                goto.append({})
                matched.append(False)
                goto[state][c] = len(goto) - 1
            state = goto[state][c]
        matched[state] = True
    fail = [0] * len(goto)
    order = list(goto[0].values())
    for state in order:  # breadth first: a state's failure link is known before its children's
        for c, child in goto[state].items():
            link = fail[state]
            while link and c not in goto[link]:
                link = fail[link]
            fail[child] = goto[link][c] if state and c in goto[link] else 0
            matched[child] = matched[child] or matched[fail[child]]
            order.append(child)
    alphabet = sorted({c for t in triggers for c in t})
    keep = [s for s in range(len(goto)) if not matched[s]]
    number = {s: i for i, s in enumerate(keep)}
    edges: dict[tuple[int, int], str] = {}
    for s in keep:
        targets: dict[int, list[str]] = {}
        for c in alphabet:
            t = s
            while t and c not in goto[t]:
                t = fail[t]
            t = goto[t].get(c, 0)
            targets.setdefault(-1 if matched[t] else number[t], []).append(c)
        elsewhere = [c for t, chars in targets.items() if t != 0 for c in chars]
        edges[(number[s], 0)] = _class(elsewhere, negated=True)
        for t, chars in targets.items():
            if t > 0:
                edges[(number[s], t)] = _class(chars, negated=False)
    return edges, len(keep)


def _class(chars: list[str], negated: bool) -> str:
    """A class of `chars`, or of every character but them (never plane 16, the call markers')."""
    ranges = [(ord(c), ord(c)) for c in chars]
    return char_class(complement(ranges) if negated else ranges) or "[^\\x{0}-\\x{10FFFF}]"


def _union(paths: dict, key: tuple[int, int], regex: str) -> None:
    if key not in paths:
        paths[key] = regex
    elif "" in (paths[key], regex):  # the empty word or the other
        paths[key] = f"(?:{paths[key] or regex})?"
    else:
        paths[key] = f"{paths[key]}|{regex}"


def _group(regex: str) -> str:
    return f"(?:{regex})" if regex else ""


def _cat(*parts: str) -> str:
    return "".join(_group(p) if "|" in p else p for p in parts)
