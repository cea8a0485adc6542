"""Structured-program workloads (issue 8): langrt with and without its radix cache vs HF
transformers, on the built-in model. `run.py` drives them.

Module map: data (seeded synthetic text), base (Workload, one measured run), recording (the
recording backend, hit rate and its offline optimum), hf_backend (the transformers baseline as a
frontend backend), report (README table and chart), and one module per workload.
"""

from benchmarks.workloads import chat, few_shot, fork_vote, hellaswag, json_decode, llm_judge, tree_of_thought

ALL = (
    few_shot.WORKLOAD,
    hellaswag.WORKLOAD,
    chat.SHORT,
    chat.LONG,
    tree_of_thought.WORKLOAD,
    fork_vote.WORKLOAD,
    json_decode.REGEX,
    json_decode.SCHEMA_WORKLOAD,
    llm_judge.WORKLOAD,
)
