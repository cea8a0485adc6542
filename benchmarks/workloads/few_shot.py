"""Few-shot multiple choice (MMLU-like): per subject a ~1,150-token preamble (reference notes and
5 answered examples), then each question answered with one greedy token (SGLang's MMLU
benchmark does the same). Questions of one subject share the preamble; subjects share nothing
but the instruction's first words."""

from __future__ import annotations

import langrt_frontend as sgl

from benchmarks.workloads.base import Workload, accuracy
from benchmarks.workloads.data import SUBJECTS, mc_subject


@sgl.function
def few_shot_mc(s, preamble, question):
    s += preamble + question
    s += sgl.gen("answer", max_tokens=1)


def items(quick: bool) -> list[dict]:
    subjects, per_subject = (1, 4) if quick else (2, 24)
    out = []
    for i, name in enumerate(SUBJECTS[:subjects]):
        subject = mc_subject(seed=100 + i, subject=name, questions=per_subject)
        out += [{"preamble": subject.preamble, "question": q, "answer": a} for q, a in subject.questions]
    return out


WORKLOAD = Workload(
    name="few_shot_mmlu",
    title="MMLU-like 5-shot, 1-token answers",
    program=few_shot_mc,
    items=items,
    group="few_shot",
    quality=lambda states, items: accuracy(states, items, "answer", lambda item: item["answer"]),
)
