"""LLM judge (SGLang's llm_judge benchmark): an article of ~350 tokens, fork(6) judgments along
six rubric dimensions, their texts merged back, and a final 1-10 score."""

from __future__ import annotations

import random

import langrt_frontend as sgl

from benchmarks.workloads.base import Workload
from benchmarks.workloads.data import paragraph

DIMENSIONS = (
    "Content: is the article's content accurate and relevant?",
    "Organization: is the article logically structured?",
    "Evidence: does the article support its claims?",
    "Style: is the writing clear and engaging?",
    "Concision: does the article avoid repetition?",
    "Originality: does the article offer a fresh view?",
)


@sgl.function
def judge(s, article):
    s += sgl.system("You are an expert judge of writing quality.")
    s += sgl.user("Please judge the quality of the article below along the metric I give you. Give a single-paragraph "
                  "judgement, focused on that metric only.\n\nArticle:\n" + article)  # fmt: skip
    forks = s.fork(len(DIMENSIONS))
    for fork, dimension in zip(forks, DIMENSIONS):
        fork += sgl.user(dimension)
        fork += sgl.assistant(sgl.gen("judgement", max_tokens=24))
    forks.join()
    merged = "\n".join(f"{d.split(':')[0]}: {j.strip()}" for d, j in zip(DIMENSIONS, s["judgement"]))
    s += sgl.assistant("Here are my judgements:\n" + merged)
    s += sgl.user("Based on these judgements, give the article a final score from 1 to 10.")
    s += sgl.assistant("Final score: " + sgl.gen("score", max_tokens=3, regex=r"([1-9]|10)"))


def items(quick: bool) -> list[dict]:
    rng = random.Random(700)
    return [{"article": paragraph(rng, 26)} for _ in range(1 if quick else 4)]


def scored(states, items) -> dict:
    return {"scored": sum(s["score"].strip().isdigit() for s in states) / len(items)}


WORKLOAD = Workload(
    name="llm_judge",
    title="LLM judge, fork(6) rubric + final score",
    program=judge,
    items=items,
    quality=scored,
)
