"""The schema resources of one JSON-schema document, for `$ref`: where `$id`s and anchors sit."""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin

# Keywords whose value is a subschema, a list of them, or a name -> subschema map: where
# embedded resources ($id) and anchors can sit. Data keywords (const, enum, default) are not
# walked, so a "$id" inside an example value is not mistaken for a resource.
_SUBSCHEMA = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)
_SUBSCHEMA_LISTS = ("prefixItems", "allOf", "anyOf", "oneOf")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


class Resources:
    """The schema resources of one document: each `$id` (resolved against its parent's URI)
    and each `$anchor` / `$dynamicAnchor` (read as a plain anchor by `$ref`)."""

    def __init__(self, root):
        self.by_uri: dict[str, Any] = {}
        self.anchors: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._uri_of: dict[int, str] = {}
        self._walk(root, root, "", top=True)

    def uri(self, resource) -> str:
        return self._uri_of.get(id(resource), "")

    def _walk(self, s, resource, uri: str, top: bool = False) -> None:
        if not isinstance(s, dict):
            return
        if top or isinstance(s.get("$id"), str):
            uri = urljoin(uri, s.get("$id", "")).partition("#")[0]
            resource = s
            self._uri_of[id(s)] = uri
            self.by_uri.setdefault(uri, s)
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(s.get(key), str):
                self.anchors.setdefault((uri, s[key]), (s, resource))
        for key in _SUBSCHEMA:
            self._walk(s.get(key), resource, uri)
        for key in _SUBSCHEMA_LISTS:
            for sub in s.get(key) if isinstance(s.get(key), list) else [s.get(key)]:
                self._walk(sub, resource, uri)
        for key in _SUBSCHEMA_MAPS:
            if isinstance(s.get(key), dict):
                for sub in s[key].values():
                    self._walk(sub, resource, uri)
