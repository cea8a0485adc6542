"""Server metrics in the Prometheus text exposition format (GET /metrics)."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from langrt.server.req_state import ReqState

RECENT = 512  # latencies kept for the dashboard's p50 / p99
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def render(self, name: str, help_text: str, labels: str = "") -> list[str]:
        """`labels`: extra label pairs, e.g. 'model_name="m"'."""
        bucket = f"{labels}," if labels else ""
        own = f"{{{labels}}}" if labels else ""
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{{bucket}le="{bound}"}} {n}' for bound, n in zip(self.buckets, self.counts)]
        lines += [
            f'{name}_bucket{{{bucket}le="+Inf"}} {self.count}',
            f"{name}_sum{own} {self.total}",
            f"{name}_count{own} {self.count}",
        ]
        return lines


@dataclass
class Metrics:
    finished: Counter = field(default_factory=Counter)  # by finish type
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    recent_ttft: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_tpot: deque = field(default_factory=lambda: deque(maxlen=RECENT))

    def on_finish(self, state: ReqState) -> None:
        kind = "error" if state.error is not None else state.finish_reason["type"]
        self.finished[kind] += 1
        self.prompt_tokens += state.prompt_tokens
        self.generation_tokens += state.completion_tokens
        self.cached_tokens += state.cached_tokens
        end = state.finished_at
        self.e2e.observe(end - state.created)
        if state.first_token_at is not None:
            self.ttft.observe(state.first_token_at - state.created)
            self.recent_ttft.append(state.first_token_at - state.created)
            if state.completion_tokens > 1:
                tpot = (end - state.first_token_at) / (state.completion_tokens - 1)
                self.tpot.observe(tpot)
                self.recent_tpot.append(tpot)

    def render(self, gauges: dict[str, float]) -> str:
        lines = [
            "# HELP langrt_requests_total Finished requests by finish reason.",
            "# TYPE langrt_requests_total counter",
        ]
        lines += [f'langrt_requests_total{{finish_reason="{k}"}} {v}' for k, v in sorted(self.finished.items())]
        for name, value, text in (
            ("langrt_prompt_tokens_total", self.prompt_tokens, "Prompt tokens of finished requests."),
            ("langrt_generation_tokens_total", self.generation_tokens, "Generated tokens of finished requests."),
            ("langrt_cached_tokens_total", self.cached_tokens, "Prompt tokens reused from the prefix cache."),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]
        lines += self.ttft.render("langrt_time_to_first_token_seconds", "Time to first token.")
        lines += self.tpot.render("langrt_time_per_output_token_seconds", "Time per output token after the first.")
        lines += self.e2e.render("langrt_e2e_request_latency_seconds", "End-to-end request latency.")
        for name, value in gauges.items():
            lines += [f"# TYPE langrt_{name} gauge", f"langrt_{name} {value}"]
        return "\n".join(lines) + "\n"


class RateMeter:
    """Per-second rate of a growing total, over the time since the previous reading that is at
    least `min_interval_s` old (so that two reads close together do not give noise)."""

    def __init__(self, min_interval_s: float = 0.2):
        self.min_interval_s = min_interval_s
        self._last: tuple[float, float] | None = None
        self.rate = 0.0

    def update(self, total: float, now: float) -> float:
        if self._last is None:
            self._last = (now, total)
        elif now - self._last[0] >= self.min_interval_s:
            self.rate = max(0.0, (total - self._last[1]) / (now - self._last[0]))
            self._last = (now, total)
        return self.rate


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0-100, nearest rank) of `values`; None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def sglang_lines(metrics: Metrics, gauges: dict[str, tuple[float, str]], model_name: str) -> list[str]:
    """The same figures under SGLang's metric names (sglang/srt/metrics/collector.py), labelled
    with `model_name` as SGLang does, so dashboards and alerts written for SGLang work here.
    `gauges`: name -> (value, help text)."""
    labels = 'model_name="%s"' % model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    lines = []
    for name, kind, value, text in (
        ("prompt_tokens_total", "counter", metrics.prompt_tokens, "Number of prefill tokens processed."),
        ("generation_tokens_total", "counter", metrics.generation_tokens, "Number of generation tokens processed."),
        (
            "cached_tokens_total",
            "counter",
            metrics.cached_tokens,
            "Number of prompt tokens reused from the prefix cache.",
        ),
        ("num_requests_total", "counter", sum(metrics.finished.values()), "Number of requests processed."),
        *((name, "gauge", value, text) for name, (value, text) in gauges.items()),
    ):
        lines += [f"# HELP sglang:{name} {text}", f"# TYPE sglang:{name} {kind}", f"sglang:{name}{{{labels}}} {value}"]
    lines += metrics.ttft.render(
        "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels
    )
    lines += metrics.tpot.render(
        "sglang:time_per_output_token_seconds", "Histogram of time per output token in seconds.", labels
    )
    lines += metrics.e2e.render(
        "sglang:e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds.", labels
    )
    return lines
