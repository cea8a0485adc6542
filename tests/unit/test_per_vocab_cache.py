"""langrt/constrained/per_vocab.py: vocabulary-derived values built once per vocabulary object,
and bounded (the caches it replaced, keyed by id(vocab), never shrank)."""

from __future__ import annotations

import gc
import weakref

from langrt.constrained.per_vocab import PerVocabCache


class Vocab:  # unhashable, like TokenVocabulary (a dataclass with eq)
    __hash__ = None

    def __init__(self, n: int):
        self.token_bytes = [bytes([i]) for i in range(n)]


def test_built_once_per_vocabulary_object():
    builds = []
    cache = PerVocabCache(lambda v: builds.append(v) or len(v.token_bytes), capacity=4)
    a, b = Vocab(3), Vocab(5)
    assert [cache.get(a), cache.get(b), cache.get(a)] == [3, 5, 3]
    assert builds == [a, b]


def test_least_recently_used_goes_and_the_vocabulary_is_freed():
    cache = PerVocabCache(lambda v: len(v.token_bytes), capacity=2)
    first = Vocab(1)
    gone = weakref.ref(first)
    cache.get(first)
    for n in range(2, 6):
        cache.get(Vocab(n))
    assert len(cache) == 2
    del first
    gc.collect()
    assert gone() is None, "the cache still holds a vocabulary it dropped"


def test_recent_use_keeps_an_entry():
    builds = []
    cache = PerVocabCache(lambda v: builds.append(v) or 0, capacity=2)
    a, b, c = Vocab(1), Vocab(2), Vocab(3)
    cache.get(a), cache.get(b), cache.get(a), cache.get(c)  # b is the least recent: dropped
    cache.get(a)
    cache.get(b)
    assert builds == [a, b, c, b]


def test_the_grammar_caches_use_it():
    from langrt.constrained.cfg import masks
    from langrt.constrained.native import token_walk

    assert isinstance(masks._sorted, PerVocabCache) and isinstance(token_walk._tries, PerVocabCache)
