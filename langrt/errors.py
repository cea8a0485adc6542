"""The few typed errors langrt raises on purpose.

The HTTP layer maps each to a status code in one place; everything else is a bug (500).
"""

from __future__ import annotations


class LangrtError(Exception):
    """Base class of langrt's deliberate errors."""


class InvalidRequest(LangrtError, ValueError):
    """The request itself is wrong (HTTP 400). `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class UnsupportedSchema(InvalidRequest):
    """A JSON schema uses a keyword langrt cannot enforce exactly (HTTP 400)."""


class CapacityExceeded(InvalidRequest):
    """The request can never fit this server (its KV pool is too small for it): HTTP 400."""


class Overloaded(LangrtError):
    """Too many requests are queued; retrying later will work (HTTP 503)."""


class ServerUnavailable(LangrtError):
    """A runtime process died, or the server is shutting down (HTTP 503)."""


class ModelLoadError(LangrtError):
    """The model, its weights or its tokenizer could not be loaded."""
