"""Multi-turn chat: 4 turns, each a 256-512-token user message; short answers (at most 8 tokens,
SGLang's 4-8) or long ones (at most 256). Each turn's prompt is the whole conversation so far,
so turn k repeats turns 1..k-1, answers included."""

from __future__ import annotations

import random

import langrt_frontend as sgl

from benchmarks.workloads.base import Workload
from benchmarks.workloads.data import paragraph

TURNS = 4


@sgl.function
def chat(s, messages, max_tokens):
    for i, message in enumerate(messages):
        s += sgl.user(message)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=max_tokens))


def conversation(rng: random.Random, long: bool) -> list[str]:
    ask = ("Write a detailed, well organised essay about the notes above." if long
           else "Reply with one short sentence about the notes above.")  # fmt: skip
    # ~17 tokens a sentence: 15-30 sentences are 256-512 tokens.
    return [paragraph(rng, rng.randint(15, 30)) + "\n" + ask for _ in range(TURNS)]


def make_items(long: bool):
    def items(quick: bool) -> list[dict]:
        rng = random.Random(300 + long)
        n = (1 if long else 2) if quick else (2 if long else 6)
        # Quick mode cuts long answers to 32 tokens: 4 x 256 sequential decode steps take minutes.
        max_tokens = (32 if quick else 256) if long else 8
        return [{"messages": conversation(rng, long), "max_tokens": max_tokens} for _ in range(n)]

    return items


SHORT = Workload(
    name="chat_short",
    title="multi-turn chat, 4 turns, answers <= 8 tokens",
    program=chat,
    items=make_items(long=False),
)
LONG = Workload(
    name="chat_long",
    title="multi-turn chat, 4 turns, answers <= 256 tokens",
    program=chat,
    items=make_items(long=True),
)
