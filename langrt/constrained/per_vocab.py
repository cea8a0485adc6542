"""A small cache of values derived from a vocabulary (its spelling trie, its sorted spellings).

Keyed by the vocabulary object's identity: TokenVocabulary is a dataclass, unhashable, and two
equal vocabularies are rare enough that building twice is cheaper than comparing 150k spellings.
Each entry holds the vocabulary itself, so its id cannot be reused by another object while the
entry lives. Bounded: a server serves one or a few tokenizers, but tests and benchmarks build
hundreds, and each entry holds arrays the size of the vocabulary.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

# Why 8: a server loads one tokenizer (two with a draft model of another family); past that an
# entry is rebuilt (milliseconds to a second for a 150k vocabulary), never held forever.
DEFAULT_CAPACITY = 8


class PerVocabCache(Generic[T]):
    """`get(vocab)` builds `build(vocab)` once per vocabulary object and keeps the `capacity` most
    recently used; thread-safe (the build runs under the lock, so it runs once per vocabulary)."""

    def __init__(self, build: Callable[[object], T], capacity: int = DEFAULT_CAPACITY):
        assert capacity > 0, "a cache of no entries would rebuild on every call"
        self.build, self.capacity = build, capacity
        self._entries: OrderedDict[int, tuple[object, T]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, vocab: object) -> T:
        with self._lock:
            found = self._entries.get(id(vocab))
            if found is None or found[0] is not vocab:
                found = self._entries[id(vocab)] = (vocab, self.build(vocab))
            self._entries.move_to_end(id(vocab))
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
            return found[1]

    def __len__(self) -> int:
        return len(self._entries)
