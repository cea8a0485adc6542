"""bench_speculative's "nothing to copy" workload: no prompt repeats within or across rounds, so
n-gram drafts have no earlier answer to the same prompt to copy."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_speculative  # noqa: E402


class Template:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return f"<user>{messages[0]['content']}<assistant>"


def test_free_prompts_are_distinct_over_every_round():
    rounds = bench_speculative.by_round(bench_speculative.free_prompts(Template(), 8 * 3), 3)
    assert [len(r) for r in rounds] == [8, 8, 8]
    every = [p for r in rounds for p in r]
    assert len(set(every)) == len(every)


def test_asking_for_more_free_prompts_than_exist_is_refused_by_name():
    most = len(bench_speculative.FREE_FORMS) * len(bench_speculative.TOPICS)
    with pytest.raises(ValueError, match="fewer --requests or --rounds"):
        bench_speculative.free_prompts(Template(), most + 1)
