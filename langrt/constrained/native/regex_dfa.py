"""Regex DFAs built in C++ (regex_dfa.cpp): the grammar compilers' regex subset straight to a
byte-level DFA with its dead ends cut, ~20-50x faster per state than outlines-core's Index over
256 one-byte tokens (see benchmarks/README.md). byte_dfa.py asks here first; a regex outside the
subset, one that matches nothing, or a machine where the library cannot be built
(LANGRT_CPU_KERNELS=0, no compiler) goes to outlines-core, which reads the same language."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from langrt.constrained.native.build import LazyLibrary, build_library

SOURCE = Path(__file__).with_name("regex_dfa.cpp")
_OK, _UNSUPPORTED, _TOO_BIG = 0, 1, 2


def _load() -> ctypes.CDLL:
    library = build_library(SOURCE)
    library.langrt_regex_dfa_build.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    library.langrt_regex_dfa_build.restype = ctypes.c_void_p
    library.langrt_regex_dfa_take.argtypes = [ctypes.c_void_p] * 4
    library.langrt_regex_dfa_take.restype = None
    return library


_library = LazyLibrary(_load, "regex automata by outlines-core")


def reset() -> None:
    """Forget the library (tests that change LANGRT_CPU_KERNELS)."""
    _library.reset()


def available() -> bool:
    return _library.get() is not None


def build(regex: str, max_states: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray] | None:
    """`regex` matched whole, as (table [states + 1, 256] int32 with the dead state last,
    accepting [states + 1] bool, initial state, plane-16 edges), or None where outlines-core must
    build it. The edges are the characters U+100000-U+10FFFD readable from a state (a rule's
    calls, byte_dfa.call_marker), as rows (state, code point - U+100000, state after it); the
    table still holds their bytes. Raises ValueError past `max_states` states."""
    library = _library.get()
    if library is None:
        return None
    text = regex.encode("utf-8", "surrogatepass")
    info = np.zeros(3, dtype=np.int64)
    built = library.langrt_regex_dfa_build(text, len(text), max_states, info.ctypes.data)
    status, states, edges = (int(x) for x in info)
    if status == _TOO_BIG:
        more = f"has {states} states" if states else f"passes {max_states} states"
        raise ValueError(f"the regex's automaton {more}, over the limit of {max_states}")
    if status != _OK:
        return None
    table = np.empty((states + 1, 256), dtype=np.int32)
    accepting = np.empty(states + 1, dtype=np.uint8)
    plane16 = np.empty((edges, 3), dtype=np.int32)
    library.langrt_regex_dfa_take(built, table.ctypes.data, accepting.ctypes.data, plane16.ctypes.data)
    return table, accepting.astype(bool), 0, plane16
