"""Tree of thought (SGLang's tree-of-thought benchmark, scaled to a CPU): per question, fork(3)
plans, fork(3) executions of each plan, fork(3) self-evaluations of each execution: 3 + 9 + 27 = 39
sampled gens, every one repeating the question and its branch's history."""

from __future__ import annotations

import random

import langrt_frontend as sgl

from benchmarks.workloads.base import Workload
from benchmarks.workloads.data import word_problem

BRANCHES = 3
SAMPLING = {"temperature": 0.7, "top_p": 0.95}
PLAN_TOKENS, ANSWER_TOKENS, SCORE_TOKENS = 24, 32, 8

ASK_PLAN = ("\nPlease generate a high-level plan for solving the above question. As the first step, just "
            "say what method and idea you will use to solve the question. You can reorganize the information "
            "in the question. Do not do the actual calculation. Keep your response concise.")  # fmt: skip
ASK_EXECUTE = ("The plan looks good! Now, use real numbers and do the calculation. Please solve the question "
               "step-by-step according to the high-level plan. Give me the final answer. Make your response short.")  # fmt: skip
ASK_REFLECT = ("Okay. Now you evaluate your own solution and give it a score on a scale of 1 to 5. "
               "Please do rigorous check of the correctness.")  # fmt: skip


def expand(states, ask: str, variable: str, max_tokens: int) -> list:
    """Each state: one more user turn, then BRANCHES sampled assistant turns."""
    children = []
    for state in states:
        state += sgl.user(ask)
        forks = state.fork(BRANCHES)
        forks += sgl.assistant(sgl.gen(variable, max_tokens=max_tokens))
        children += list(forks)
    return children


@sgl.function
def tree_search(s, question):
    s += sgl.system("You are a careful math tutor who solves word problems step by step.")
    s += sgl.user(question + ASK_PLAN)
    plans = s.fork(BRANCHES)
    plans += sgl.assistant(sgl.gen("plan", max_tokens=PLAN_TOKENS))
    answers = expand(plans, ASK_EXECUTE, "answer", ANSWER_TOKENS)
    scores = expand(answers, ASK_REFLECT, "score", SCORE_TOKENS)
    return [state["score"] for state in scores]


def items(quick: bool) -> list[dict]:
    rng = random.Random(400)
    return [{"question": word_problem(rng, context_sentences=10)[0]} for _ in range(1 if quick else 2)]


WORKLOAD = Workload(
    name="tree_of_thought",
    title="tree of thought, 3x3x3 forks (39 gens/question)",
    program=tree_search,
    items=items,
    group="branching",
    sampling=SAMPLING,
)
