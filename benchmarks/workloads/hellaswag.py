"""Sentence completion (HellaSwag-like): one 20-shot preamble shared by every question, then the
question's context and a `select` over 4 endings. Two levels of sharing: the preamble across
questions, the context across a question's endings."""

from __future__ import annotations

import random

import langrt_frontend as sgl

from benchmarks.workloads.base import Workload, accuracy
from benchmarks.workloads.data import completion, completion_preamble


@sgl.function
def complete(s, preamble, context, endings):
    s += preamble + context
    s += sgl.select("ending", choices=endings)


def items(quick: bool) -> list[dict]:
    preamble = completion_preamble(seed=200)
    rng = random.Random(201)
    questions = [completion(rng) for _ in range(3 if quick else 16)]
    return [{"preamble": preamble, "context": c.context, "endings": list(c.endings), "answer": c.endings[c.label]}
            for c in questions]  # fmt: skip


WORKLOAD = Workload(
    name="hellaswag",
    title="HellaSwag-like 20-shot, select of 4",
    program=complete,
    items=items,
    group="few_shot",
    quality=lambda states, items: accuracy(states, items, "ending", lambda item: item["answer"]),
)
