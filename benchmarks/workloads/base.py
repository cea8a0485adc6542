"""A workload: an SGLang program, its seeded inputs (quick and full size), and how to check its
outputs. `run_workload` runs it once on a backend and measures it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from benchmarks.workloads.recording import RecordingBackend

GREEDY = {"temperature": 0.0}


@dataclass(frozen=True)
class Workload:
    name: str
    title: str  # one line for the table
    program: object  # an SglFunction
    items: Callable[[bool], list[dict]]  # quick -> each program's arguments (+ expected answers)
    group: str = "other"  # "few_shot" | "branching" | "other": which targets apply (run.py)
    sampling: dict = field(default_factory=lambda: dict(GREEDY))  # run_batch defaults
    quality: Callable[[list, list[dict]], dict] | None = None  # (states, items) -> figures

    def __post_init__(self):
        assert self.group in ("few_shot", "branching", "other"), self.group


@dataclass
class Run:
    """One workload on one backend."""

    seconds: float
    programs: int
    errors: list[str]
    recording: RecordingBackend
    quality: dict
    sample: str  # the end of the first program's text: what the model made of it

    def figures(self) -> dict:
        totals = self.recording.totals()
        return {
            "seconds": self.seconds,
            "programs": self.programs,
            "programs_s": self.programs / self.seconds,
            "output_tok_s": totals["output_tokens"] / self.seconds,
            **totals,
            "errors": len(self.errors),
            "first_errors": self.errors[:3],
            **self.quality,
            "sample": self.sample,
        }


def run_workload(workload: Workload, backend, quick: bool) -> Run:
    items = workload.items(quick)
    recording = RecordingBackend(backend)
    start = time.perf_counter()
    names = workload.program.arg_names
    calls = [{k: v for k, v in item.items() if k in names} for item in items]
    states = workload.program.run_batch(calls, backend=recording, **workload.sampling)
    seconds = time.perf_counter() - start
    errors = [repr(s.error()) for s in states if s.error() is not None]
    quality = workload.quality(states, items) if workload.quality and not errors else {}
    return Run(seconds, len(items), errors, recording, quality, states[0].text()[-300:])


def accuracy(states, items, variable: str, answer: Callable[[dict], str]) -> dict:
    right = sum(state[variable].strip() == answer(item).strip() for state, item in zip(states, items))
    return {"accuracy": right / len(items)}
