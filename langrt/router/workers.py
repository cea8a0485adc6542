"""The router's workers: who they are, which are healthy, and the health-check loop.

A worker is healthy when its `GET /health` answers 200. It is marked unhealthy after
`failure_threshold` failed checks in a row, or at once when a proxied request finds it refusing
or dropping connections; a later 200 brings it back. Workers come and go at run time
(`/add_worker`, `/remove_worker`); the policy is told to forget the ones that go or die (a
replica that comes back has an empty cache).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp

from langrt.router.policies import Policy, Worker

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthSettings:
    interval_s: float = 5.0  # between checks of every worker
    timeout_s: float = 5.0  # a /health slower than this counts as a failure
    failure_threshold: int = 2  # failed checks in a row before a worker is taken out


class UnknownWorker(KeyError):
    pass


class WorkerSet:
    def __init__(self, urls: list[str], policy: Policy, health: HealthSettings = HealthSettings()):
        self.policy = policy
        self.health = health
        self._workers: dict[str, Worker] = {}
        for url in urls:
            self.add(url)

    @property
    def all(self) -> list[Worker]:
        return list(self._workers.values())

    def healthy(self, excluding: set[str] = frozenset()) -> list[Worker]:
        return [w for w in self._workers.values() if w.healthy and w.url not in excluding]

    def add(self, url: str) -> Worker:
        url = normalize_url(url)
        if url in self._workers:
            raise ValueError(f"worker {url} is already registered")
        worker = self._workers[url] = Worker(url)
        return worker

    def remove(self, url: str) -> Worker:
        url = normalize_url(url)
        if url not in self._workers:
            raise UnknownWorker(f"no worker {url} is registered")
        self.policy.forget(url)
        return self._workers.pop(url)

    def mark_down(self, worker: Worker, reason: str) -> None:
        worker.failures += 1
        if worker.healthy:
            logger.warning("worker %s taken out: %s", worker.url, reason)
            worker.healthy = False
            self.policy.forget(worker.url)

    def mark_up(self, worker: Worker) -> None:
        if not worker.healthy:
            logger.warning("worker %s is healthy again", worker.url)
        worker.healthy, worker.failures = True, 0

    async def check(self, session: aiohttp.ClientSession, worker: Worker) -> bool:
        """One health check of one worker; updates its state and returns whether it is healthy."""
        try:
            timeout = aiohttp.ClientTimeout(total=self.health.timeout_s)
            async with session.get(worker.url + "/health", timeout=timeout) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            ok = False
        if ok:
            self.mark_up(worker)
        elif worker.failures + 1 >= self.health.failure_threshold:
            self.mark_down(worker, "its /health failed")
        else:
            worker.failures += 1
        return ok

    async def check_forever(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.gather(*(self.check(session, w) for w in self.all))
            await asyncio.sleep(self.health.interval_s)


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url
