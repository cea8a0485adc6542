"""Routing policies: which worker gets a request. One factory, `make_policy`.

Contract of a policy: `choose(text, workers)` is given the prompt text (possibly empty) and the
healthy workers (never empty) and returns one of them; it may record the choice (cache_aware's
tree) but changes no worker. `forget(url)` drops what it knows of a removed worker. Load is the
router's own count of requests in flight per worker (`Worker.in_flight`), as in sgl-router.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Protocol, Sequence

from langrt.router.tree import PrefixTree

POLICIES = ("cache_aware", "round_robin", "random", "least_load")


@dataclass
class Worker:
    url: str
    in_flight: int = 0
    healthy: bool = True
    sent: int = 0  # requests routed here
    failures: int = 0  # consecutive failed health checks or connections


class Policy(Protocol):
    name: str

    def choose(self, text: str, workers: Sequence[Worker]) -> Worker: ...

    def forget(self, url: str) -> None: ...


def _least_loaded(workers: Sequence[Worker]) -> Worker:
    return min(workers, key=lambda w: (w.in_flight, w.sent))


class RoundRobin:
    name = "round_robin"

    def __init__(self):
        self._next = itertools.count()

    def choose(self, text: str, workers: Sequence[Worker]) -> Worker:
        return workers[next(self._next) % len(workers)]

    def forget(self, url: str) -> None:
        pass


class RandomPolicy:
    name = "random"

    def __init__(self, seed: int | None = None):
        self._random = random.Random(seed)

    def choose(self, text: str, workers: Sequence[Worker]) -> Worker:
        return self._random.choice(list(workers))

    def forget(self, url: str) -> None:
        pass


class LeastLoad:
    name = "least_load"

    def choose(self, text: str, workers: Sequence[Worker]) -> Worker:
        return _least_loaded(workers)

    def forget(self, url: str) -> None:
        pass


@dataclass(frozen=True)
class CacheAwareSettings:
    # A match must cover more than this fraction of the prompt to be followed; below it the
    # prompt is new, and goes to the worker whose tree is smallest (most room in its cache).
    cache_threshold: float = 0.5
    # Load imbalance that overrides the cache: the busiest worker has more than `balance_abs`
    # requests in flight beyond the idlest AND more than `balance_rel` times its load. Then the
    # idlest gets the request (cache locality never starves a replica while another queues).
    balance_abs: int = 32
    balance_rel: float = 1.5
    # Characters of prompt text remembered per worker; roughly a worker's KV pool in tokens times
    # ~4 characters per token. Older entries are forgotten first.
    max_tree_chars: int = 2_000_000


class CacheAware:
    name = "cache_aware"

    def __init__(self, settings: CacheAwareSettings = CacheAwareSettings()):
        self.settings = settings
        self.tree = PrefixTree()

    def choose(self, text: str, workers: Sequence[Worker]) -> Worker:
        chosen = self._balanced(workers) if self.imbalanced(workers) else self._by_cache(text, workers)
        if text:
            self.tree.insert(text, chosen.url)
            self.tree.evict(chosen.url, self.settings.max_tree_chars)
        return chosen

    def imbalanced(self, workers: Sequence[Worker]) -> bool:
        loads = [w.in_flight for w in workers]
        high, low = max(loads), min(loads)
        return high - low > self.settings.balance_abs and high > low * self.settings.balance_rel

    def forget(self, url: str) -> None:
        self.tree.remove_worker(url)

    def _balanced(self, workers: Sequence[Worker]) -> Worker:
        return _least_loaded(workers)

    def _by_cache(self, text: str, workers: Sequence[Worker]) -> Worker:
        by_url = {w.url: w for w in workers}
        match = self.tree.match(text, among=set(by_url))
        if text and match.length / len(text) > self.settings.cache_threshold:
            return _least_loaded([by_url[url] for url in match.workers])
        return min(workers, key=lambda w: (self.tree.chars(w.url), w.in_flight, w.sent))


def make_policy(name: str, seed: int | None = None) -> Policy:
    if name == "cache_aware":
        return CacheAware()
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return RandomPolicy(seed)
    if name == "least_load":
        return LeastLoad()
    raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(POLICIES)}")
