"""Objects for the JSON-schema compiler (a mixin of compiler._Compiler): listed properties in
the schema's order, with the keys `patternProperties` and an explicit `additionalProperties`
allow before, between and after them, under the property counts. With `propertyNames`, only
the listed names it is proved to accept (no other keys: narrower, never wrong).

A key's value must satisfy every schema that applies to it: its `properties` entry and each
pattern it matches (jsonschema's re.search on the name), else `additionalProperties`. A key
generated for one pattern may match others, or be a listed name written another way, so its
value also satisfies the schemas of every pattern that may overlap (only patterns anchored at
distinct literal prefixes are taken as disjoint) and of every listed name the pattern matches:
stricter than the schema where they do not overlap, never looser.
"""

from __future__ import annotations

import re

from langrt.constrained.dfa_product import intersection_body
from langrt.constrained.json_schema import regex as rx
from langrt.constrained.json_schema.flat import Flat, Node, check_pending
from langrt.constrained.json_schema.keys import key_not_in
from langrt.constrained.json_schema.pattern import emit, translate, with_length
from langrt.constrained.json_schema.rules import calls_any
from langrt.errors import UnsupportedSchema


# Why 6: any order tracks which required properties are written, one rule per subset (2**6 = 64
# rules); with more, the required ones keep the schema's order and the others go anywhere.
ANY_ORDER_MAX_REQUIRED = 6
# Why 30,000: the optional members are copied into every subset's rule; past this they are one rule.
ANY_ORDER_MAX_CHARS = 30_000
# Why 500: what may follow a set of written properties is copied into its callers while short
# (a DFA of a few states, no call: no stack frame, no mask crossing a rule's end); longer, a rule.
ANY_ORDER_INLINE_CHARS = 500

_STRING_SCHEMA = {"type": "string"}
_STRING = Node(_STRING_SCHEMA, _STRING_SCHEMA)


class ObjectMixin:
    def object(self, f: Flat) -> str | None:
        check_pending(f, "object")
        if not f.object_keywords:  # no properties/required/additionalProperties: any object
            return self._any_object(f)
        names = [n for n in list(f.props) + [r for r in f.required if r not in f.props] if n not in f.forbidden]
        if f.property_names:  # propertyNames: listed names proved to satisfy it, no other keys
            names = [n for n in names if self.fits(f.property_names, f.refs, n)]
        if any(r in f.forbidden or r not in names for r in f.required):
            return None
        # With rules, values are calls: an object's rule holds its keys and calls, and the rule of
        # a value (a number, a string, ...) is shared by every member and schema that writes it
        # (60 MaskBench schemas: compile p50 18.5 -> 12.8 ms, p99 833 -> 417 ms; mask p99 546 -> 612 us)
        members = self._listed_members(f, names, calls=self.book is not None)
        if members is None:
            return None
        n_required = sum(req for _, req in members)
        if f.max_props is not None and n_required > f.max_props:
            return None
        if f.max_props is not None and len(members) > f.max_props:
            raise UnsupportedSchema(
                f"'maxProperties': {f.max_props} is less than the {len(members)} properties the schema allows",
                param="maxProperties",
            )
        if f.property_names and not (self.book is not None and (f.pattern_props or f.additional is not None)):
            kv = self._named_kv(f, names)
        else:
            kv = self._extra_kv(f, names)
        if kv is not None and (f.max_props is not None or self.book is None):
            # counted (or one regex, which copies would swell): after the listed ones
            room = None if f.max_props is None else f.max_props - len(members)
            if room is None or room > 0:
                members.append((kv + rx.repeat(self.comma + kv, 0, None if room is None else room - 1), False))
            kv = None
        elif kv is not None:
            kv = self.book.rule_for(kv)  # written at every gap: one rule, called
        if f.min_props > max(n_required, 1 if members or kv else 0) or (f.min_props > n_required and n_required):
            raise UnsupportedSchema(
                f"'minProperties': {f.min_props} is more than the {n_required} required properties",
                param="minProperties",
            )
        if self.any_order and self.book is not None and f.max_props is None and (len(members) > 1 or kv):
            body = self._any_order(f, names, members, kv)
            if body is not None:
                return self.container("\\{", "\\}", body, not n_required and f.min_props == 0)
        body, optional = self._members(members, kv)
        return self.container("\\{", "\\}", body, optional and f.min_props == 0)

    def _any_order(self, f: Flat, names: list[str], members: list, extra: str | None) -> str | None:
        """Members in any order: each required one once, the others (and `extra`) any number of
        times (a repeated key's values each satisfy its schema, and the parsed object keeps the
        last, so it stays valid). One rule per set of required members written (copied into its
        callers while short), each ending in a tail call to the next set's. None past ANY_ORDER_MAX_REQUIRED required members."""
        required = [m for m, req in members if req]
        if len(required) > ANY_ORDER_MAX_REQUIRED:
            return None
        # values as calls: the rules of the sets of written members are keys and calls, and the
        # values' rules are shared (MaskBench sample: compile p50 51 -> 42 ms, mask p50 10.6 -> 6.6 us)
        members = self._listed_members(f, names, calls=True)
        required = [m for m, req in members if req]
        optional = rx.alt([m for m, req in members if not req] + [extra])
        if optional is not None and len(optional) << len(required) > ANY_ORDER_MAX_CHARS:
            optional = self.book.rule_for(optional)  # else copied into every set's rule
        c, full, after = self.comma, (1 << len(required)) - 1, {}
        more = rx.repeat(None if optional is None else c + optional, 0, None)
        for written in sorted(range(full + 1), key=lambda s: -s.bit_count()):
            nexts = [c + m + after[written | 1 << i] for i, m in enumerate(required) if not written >> i & 1]
            text = more + rx.alt(nexts + ([""] if written == full else []))
            after[written] = text if len(text) <= ANY_ORDER_INLINE_CHARS else self.book.rule_for(text)
        firsts = [rx.seq(optional, after[0])] + [m + after[1 << i] for i, m in enumerate(required)]
        return rx.alt(firsts)

    def _listed_members(self, f: Flat, names: list[str], calls: bool) -> list | None:
        """(regex, required) of each listed property that can have a value; None if a required
        one cannot. calls: each value a rule call (short members, for the all-optional form)."""
        members = []
        for name in names:
            nodes = self._member_nodes(f, name)
            v = (self.value_call if calls else self.value)(nodes, f.refs) if nodes is not None else self.any_value()
            member = rx.seq(rx.string_literal(name), self.colon, v)
            if member is None:
                if name in f.required:
                    return None
                continue
            members.append((member, name in f.required))
        return members

    def _member_nodes(self, f: Flat, name: str):
        """The schemas a property's value must satisfy (None: any value)."""
        matched = [n for pattern, nodes in f.pattern_props if _search(pattern, name) for n in nodes]
        if name in f.props:
            return f.props[name] + matched
        return matched or f.additional

    def _any_object(self, f: Flat) -> str | None:
        if f.min_props > 1:
            # Duplicate keys would count twice in the text and once in the parsed object.
            raise UnsupportedSchema(
                "'minProperties' above 1 is supported only with required properties", param="minProperties"
            )
        key = key_not_in(f.forbidden) if f.forbidden else rx.JSON_STRING
        kv = key + self.colon + self.any_value()
        more = None if f.max_props is None else f.max_props - 1
        body = None if f.max_props == 0 else kv + rx.repeat(self.comma + kv, 0, more)
        return self.container("\\{", "\\}", body, optional=f.min_props == 0)

    def _extra_kv(self, f: Flat, names: list[str]) -> str | None:
        """One property beyond the listed ones: a key of each pattern; any other key only with
        an explicit additionalProperties, or absent with open objects (values that satisfy
        every pattern's schema too)."""
        kvs = [self._pattern_member(f, i, names) for i in range(len(f.pattern_props))]
        additional = f.additional if f.additional is not None or not self.open_objects else []
        if additional is not None:
            # keys no pattern can match: not starting with an anchored pattern's literal prefix;
            # other patterns may match, so their schemas apply too
            prefixes = [_literal_prefix(p) for p, _ in f.pattern_props]
            nodes = additional + [n for (_, ns), x in zip(f.pattern_props, prefixes) if x is None for n in ns]
            v = self.value(nodes, f.refs) if nodes else self.any_value()
            key = key_not_in(names + f.forbidden, [x for x in prefixes if x is not None])
            kvs.append(rx.seq(self._keys_named(f, key), self.colon, v))
        return rx.alt(kvs)

    def _keys_named(self, f: Flat, key: str | None) -> str | None:
        """`key` (a key's regex, quotes included) cut to the names `propertyNames` accepts: a
        rule whose automaton is both at once (dfa_product.py; rules only)."""
        if not f.property_names or key is None:
            return key
        named = self.value(f.property_names + [_STRING], f.refs)
        if named is None:
            return None
        if self.book is None or calls_any(named) or calls_any(key):
            raise UnsupportedSchema(
                "'propertyNames' beside patternProperties or additionalProperties", param="propertyNames"
            )
        return self.book.rule_for(intersection_body([key, named], why="'propertyNames' cutting the keys"))

    def _named_kv(self, f: Flat, names: list[str]) -> str | None:
        """With propertyNames: other keys only where nothing else names keys (no properties,
        required or patterns), written as strings its schema accepts."""
        if f.props or f.required or f.pattern_props or names:
            return None
        key = self.value(f.property_names + [_STRING], f.refs)
        v = self.value(f.additional, f.refs) if f.additional else self.any_value()
        return rx.seq(key, self.colon, v)

    def _pattern_member(self, f: Flat, i: int, names: list[str]) -> str | None:
        pattern, nodes = f.pattern_props[i]
        if any(_search(pattern, name) for name in f.forbidden):
            return None  # its keys could spell a forbidden name
        others = [n for j, (p, ns) in enumerate(f.pattern_props) if j != i and _may_overlap(pattern, p) for n in ns]
        listed = [n for name in names if name in f.props and _search(pattern, name) for n in f.props[name]]
        key = rx.seq('"', rx.alt(emit(a) for a in with_length(translate(pattern, "patternProperties"), 0, None)), '"')
        key = self._keys_named(f, key)
        return rx.seq(key, self.colon, self.value(nodes + others + listed, f.refs))

    def _members(self, members: list[tuple[str, bool]], extra: str | None) -> tuple[str | None, bool]:
        """Members in order, separated by commas, with `extra` (one more property, or None)
        allowed any number of times before, between and after them; (regex, may be empty)."""
        if not members and extra is None:
            return None, True
        c = self.comma
        first_required = next((i for i, (_, req) in enumerate(members) if req), None)
        if first_required is not None and extra is None:
            # Optional members before the first required one carry their comma after them.
            body = "".join(rx.opt(m + c) for m, _ in members[:first_required]) + members[first_required][0]
            for m, req in members[first_required + 1 :]:
                body += c + m if req else rx.opt(c + m)
            return body, False
        # Whichever property comes first has no comma before it: one alternative for each that
        # may (quadratic in the members before the first required one, which the regex length
        # limit bounds). tails[i]: what may follow once something is written, from member i.
        gap = rx.repeat(c + extra, 0, None) if extra is not None else ""
        tails = [gap]
        for m, req in reversed(members):
            tails.append(gap + (c + m if req else rx.opt(c + m)) + tails[-1])
        tails.reverse()
        last = len(members) if first_required is None else first_required + 1
        firsts = [m + tails[i + 1] for i, (m, _) in enumerate(members[:last])]
        if extra is not None:
            firsts.append(extra + tails[0])
        return rx.alt(firsts), first_required is None


def _search(pattern: str, name: str) -> bool:
    """What jsonschema runs for patternProperties."""
    try:
        return re.search(pattern, name) is not None
    except re.error as e:
        raise UnsupportedSchema(f"patternProperties {pattern!r}: {e}", param="patternProperties") from None


_LITERAL_PREFIX = re.compile(r"\^([A-Za-z0-9_\-@:/ ]*)(.?)")


def _literal_prefix(pattern: str) -> str | None:
    """The literal text every match starts with, for a pattern anchored with ^ (None if not)."""
    m = _LITERAL_PREFIX.match(pattern)
    if m is None or "|" in pattern:
        return None
    prefix, after = m.groups()
    return prefix[:-1] if after and after in "?*{" else prefix


def _may_overlap(p: str, q: str) -> bool:
    """False only when both patterns start with ^ and literal prefixes neither of which
    begins the other (no name matches both)."""
    x, y = _literal_prefix(p), _literal_prefix(q)
    return x is None or y is None or x.startswith(y) or y.startswith(x)
