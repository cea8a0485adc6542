"""bench_offline.timed: every timed generate starts on flushed caches, and each round has
prompts no other round (nor the warm-up) used, so a runtime's cache cannot make a repeat fast."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_offline  # noqa: E402


class Recorder:
    """A runner that logs its calls: ("flush",) or ("generate", texts, new_tokens)."""

    name = "recorder"

    def __init__(self):
        self.calls = []

    def flush(self):
        self.calls.append(("flush",))

    def generate(self, texts, new_tokens):
        self.calls.append(("generate", tuple(texts), new_tokens))
        return len(texts) * new_tokens


def test_every_timed_generate_follows_a_flush_and_rounds_never_share_prompts():
    runner = Recorder()
    row = bench_offline.timed(runner, lambda r: [f"prompt a round {r}", f"prompt b round {r}"], 8, repeats=3)
    warm_up, *timed_calls = runner.calls
    assert warm_up == ("generate", ("prompt a round -1",), 4)
    generates = [i for i, call in enumerate(timed_calls) if call[0] == "generate"]
    assert len(generates) == 6, "per round: the timed run and the first-token run"
    assert all(timed_calls[i - 1] == ("flush",) for i in generates)
    prompts_by_round = [timed_calls[i][1] for i in generates[::2]]
    assert len(set(prompts_by_round)) == 3 and ("prompt a round -1",) not in prompts_by_round
    assert [timed_calls[i][2] for i in generates] == [8, 1] * 3
    assert row["tokens"] == 16 and row["first_token_s"] >= 0


def test_a_runner_without_a_cache_is_timed_without_flushing():
    class NoCache:
        def __init__(self):
            self.calls = 0

        def generate(self, texts, new_tokens):
            self.calls += 1
            return len(texts) * new_tokens

    runner = NoCache()
    bench_offline.timed(runner, ["a", "b"], 4, repeats=2)
    assert runner.calls == 1 + 2 * 2
