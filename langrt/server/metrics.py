"""Server metrics in the Prometheus text exposition format (GET /metrics)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from langrt.server.req_state import ReqState

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

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{bound}"}} {n}' for bound, n in zip(self.buckets, self.counts)]
        lines += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.total}", f"{name}_count {self.count}"]
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
            if state.completion_tokens > 1:
                self.tpot.observe((end - state.first_token_at) / (state.completion_tokens - 1))

    def render(self, gauges: dict[str, float]) -> str:
        lines = ["# HELP langrt_requests_total Finished requests by finish reason.", "# TYPE langrt_requests_total counter"]
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
