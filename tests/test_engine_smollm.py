"""The built-in SmolLM2-135M-Instruct through langrt.Engine: content where a 135M model is reliable."""

from __future__ import annotations

import pytest

import langrt

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "What is 2 + 2?",
    "Name a primary colour.",
    "What do bees make?",
    "Say hello in French.",
    "What is the largest ocean on Earth?",
    "How many days are in a week?",
    "What colour is the sky on a clear day?",
]


@pytest.fixture(scope="module")
def engine():
    return langrt.Engine(progress=False, log_level="warning", max_total_tokens=16384)


def chat(engine, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


GREEDY = {"max_new_tokens": 24, "temperature": 0}


def test_capital_of_france(engine):
    out = engine.generate(chat(engine, QUESTIONS[0]), GREEDY)
    assert "Paris" in out["text"]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": engine.tokenizer.eos_token_id}
    again = engine.generate(chat(engine, QUESTIONS[0]), GREEDY)
    assert again["output_ids"] == out["output_ids"]


def test_batch_of_eight_equals_each_alone(engine):
    prompts = [chat(engine, q) for q in QUESTIONS]
    batched = engine.generate(prompts, GREEDY)
    alone = [engine.generate(p, GREEDY) for p in prompts]
    assert [o["output_ids"] for o in batched] == [o["output_ids"] for o in alone]


def test_stop_string_cuts_before_the_match(engine):
    out = engine.generate(chat(engine, QUESTIONS[0]), {**GREEDY, "stop": ["Paris"]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "Paris"}
    assert "Paris" not in out["text"] and out["text"].startswith("The capital of France is")
