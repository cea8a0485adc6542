"""The dashboard's state (GET /dashboard/state and its SSE stream), in the main process.

One `Dashboard` per server: it asks the scheduler for a bounded snapshot (messages
SnapshotRequest; at most one request in flight, and one per `min_poll_s` however many pages
are open), turns token ids into words, and keeps the time series the page plots (tokens/s in
and out, cache hit rate, KV pool use, queue length, TTFT/TPOT p50/p99, grammar mask time).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque

from langrt.server.metrics import RateMeter, percentile

SERIES_POINTS = 240  # two minutes at the page's 0.5 s
LABEL_CACHE = 4096  # decoded labels kept (node heads repeat from one snapshot to the next)


class Dashboard:
    def __init__(self, manager, min_poll_s: float = 0.25, sample_s: float = 0.5):
        self.manager = manager
        self.min_poll_s = min_poll_s  # snapshots closer together are served from the last one
        self.sample_s = sample_s
        self.series: deque[dict] = deque(maxlen=SERIES_POINTS)
        self.seq = 0
        self._last: tuple[float, dict] | None = None
        self._lock = asyncio.Lock()
        self._rates = {"out": RateMeter(), "prompt": RateMeter(), "cached": RateMeter()}
        self._labels: OrderedDict[tuple[int, ...], str] = OrderedDict()

    async def state(self) -> dict:
        async with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < self.min_poll_s:
                return self._last[1]
            reply = await self.manager.snapshot()
            self.seq += 1
            state = self._assemble(reply, time.monotonic())
            self._last = (now, state)
            return state

    def _assemble(self, reply, now: float) -> dict:
        s = reply.state
        tree = s["tree"]
        for node in tree["nodes"] + tree["evictions"]:
            node["label"] = self.label(node.pop("head"))
        for req in s["running"] + s["waiting"]:
            req["prompt"] = self.label(req.pop("prompt_head"))
        self._sample(s, now)
        return {
            "seq": self.seq,
            "time": time.time(),
            **s,
            "series": list(self.series),
            "scheduler": {"busy_s": reply.busy_s, "steps": reply.steps, "snapshot_s": reply.snapshot_s},
        }

    def _sample(self, s: dict, now: float) -> None:
        """One point of the time series, at most every `sample_s`."""
        counters, metrics = s["counters"], self.manager.metrics
        out_total = metrics.generation_tokens + counters["live_output_tokens"]
        prompt_rate = self._rates["prompt"].update(counters["prompt_tokens"], now)
        cached_rate = self._rates["cached"].update(counters["cached_prompt_tokens"], now)
        point = {
            "t": time.time(),
            "tokens_in_s": prompt_rate,  # prompt tokens admitted per second, cached ones included
            "tokens_out_s": self._rates["out"].update(out_total, now),
            # over the last interval where prompts came in; the run's rate otherwise
            "cache_hit_rate": cached_rate / prompt_rate if prompt_rate else counters["cache_hit_rate"],
            "kv_use": 1 - s["cache"]["kv_available_tokens"] / max(1, s["cache"]["kv_total_tokens"]),
            "queue": s["num_waiting"],
            "running": s["num_running"],
            "ttft_p50": percentile(metrics.recent_ttft, 50),
            "ttft_p99": percentile(metrics.recent_ttft, 99),
            "tpot_p50": percentile(metrics.recent_tpot, 50),
            "tpot_p99": percentile(metrics.recent_tpot, 99),
            "mask_ms": s["grammar"]["running_mask_ms"],
        }
        if not self.series or point["t"] - self.series[-1]["t"] >= self.sample_s:
            self.series.append(point)

    def label(self, ids: list[int]) -> str:
        """The text of some token ids (a node's or prompt's first words), cached."""
        key = tuple(ids)
        text = self._labels.get(key)
        if text is None:
            text = self.manager.tokenizer.decode(ids, skip_special_tokens=False)
            self._labels[key] = text
            if len(self._labels) > LABEL_CACHE:
                self._labels.popitem(last=False)
        else:
            self._labels.move_to_end(key)
        return text
