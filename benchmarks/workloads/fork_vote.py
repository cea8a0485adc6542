"""Fork and vote: 5 sampled candidate answers to a question about a ~400-token passage, in
parallel forks, then the model votes among the distinct candidates with `select`."""

from __future__ import annotations

import random

import langrt_frontend as sgl

from benchmarks.workloads.base import Workload
from benchmarks.workloads.data import facts_about

CANDIDATES = 5


@sgl.function
def fork_vote(s, passage, question):
    s += sgl.user(f"{passage}\n\n{question} Answer with the number only.")
    s += sgl.assistant_begin()
    forks = s.fork(CANDIDATES)
    forks += sgl.gen("candidate", max_tokens=8, temperature=0.8, stop=["\n"])
    forks.join()
    s += sgl.assistant_end()
    candidates = list(dict.fromkeys(c.strip() or "(no answer)" for c in s["candidate"]))
    s += sgl.user("Candidate answers: " + "; ".join(candidates) + ". Which candidate is correct?")
    s += sgl.assistant("The correct answer is " + sgl.select("vote", choices=candidates))


def items(quick: bool) -> list[dict]:
    rng = random.Random(500)
    out = []
    for _ in range(2 if quick else 6):
        facts = facts_about(rng, "geology", 28)
        asked = rng.choice(facts)
        passage = "Survey notes:\n" + "\n".join(f.statement() for f in facts)
        out.append({"passage": passage, "question": f"What is the {asked.attribute} of {asked.entity}?",
                    "answer": str(asked.value)})  # fmt: skip
    return out


def votes_right(states, items) -> dict:
    return {"vote_accuracy": sum(s["vote"].strip() == it["answer"] for s, it in zip(states, items)) / len(items)}


WORKLOAD = Workload(
    name="fork_vote",
    title="fork-and-vote, 5 candidates + select",
    program=fork_vote,
    items=items,
    group="branching",
    quality=votes_right,
)
