"""Token masks computed on a thread during the forward pass (scheduler.constraints.MaskPrefetch):
the same tokens as computing them after the pass, the work done on the thread, and a failure
there left to the scheduler thread."""

from __future__ import annotations

import json
import threading

import pytest
from runner_driver import make_scheduler, run_requests
from test_constrained import TREE_SCHEMA

from langrt.constrained.cfg.masks import PushdownMasks
from langrt.constrained.masks import TokenMasks
from langrt.request import Req
from langrt.sampling.sampling_params import SamplingParams
from langrt.scheduler.constraints import MaskPrefetch

REGEX = r'\{"name": "[a-z]{1,10}", "kind": "(cat|dog)", "legs": [0-9]\}'


def constrained_reqs(tokenizer) -> list[Req]:
    grammars = [{"regex": REGEX}, {"json_schema": json.dumps(TREE_SCHEMA)}] * 2
    return [
        Req(
            f"r{i}",
            tokenizer.encode(f"Prompt {i}: an animal as JSON"),
            SamplingParams(max_new_tokens=60, temperature=0, **g),
        )
        for i, g in enumerate(grammars)
    ]


@pytest.fixture
def computed_on(monkeypatch):
    """The names of the threads that computed each new mask (regex states and grammar
    configurations alike)."""
    threads = []
    for cls in (TokenMasks, PushdownMasks):
        compute = cls._compute

        def recorded(self, state, compute=compute):
            threads.append(threading.current_thread().name)
            return compute(self, state)

        monkeypatch.setattr(cls, "_compute", recorded)
    return threads


@pytest.mark.parametrize("jump", [True, False])
def test_prefetched_masks_give_the_same_tokens(tiny_llama_dir, computed_on, jump):
    outputs, on_thread, total = {}, {}, {}
    for prefetch in (True, False):
        computed_on.clear()
        scheduler = make_scheduler(
            tiny_llama_dir, max_total_tokens=4096, disable_jump_forward=not jump, disable_mask_prefetch=not prefetch
        )
        reqs = constrained_reqs(scheduler.tokenizer)
        outputs[prefetch] = run_requests(scheduler, reqs)
        assert all(r.finished for r in reqs)
        on_thread[prefetch] = sum(name.startswith("langrt-masks") for name in computed_on)
        total[prefetch] = len(computed_on)
    assert outputs[True] == outputs[False]
    assert total[True] == total[False] > 0, "the same masks are computed either way"
    assert on_thread[False] == 0
    if jump:
        # jump-forward's certain tails and drafts read the states ahead right after sampling, on
        # the scheduler thread (the next batch needs them); the pass's own masks are prefetched
        assert 0 < on_thread[True] < total[True]
    else:
        assert on_thread[True] == total[True], "token by token, every mask is computed during a pass"


class Exploding:
    def prefetch(self, drafts):
        raise RuntimeError("boom")


class Matched:
    def __init__(self, matcher):
        self.matcher, self.finished, self.draft_ids = matcher, False, [1, 2]


def test_a_failed_prefetch_leaves_the_pass_alone():
    masks = MaskPrefetch()
    assert masks.during([Matched(Exploding())], lambda: 42) == 42
    masks.close()


def test_the_pass_waits_for_the_thread_and_its_error_propagates():
    started, release, done = threading.Event(), threading.Event(), []

    class Slow:
        def prefetch(self, drafts):
            started.set()
            release.wait(5)
            done.append(list(drafts))

    masks = MaskPrefetch()

    def forward():
        assert started.wait(5)  # the thread runs while the pass does
        release.set()
        raise ValueError("forward failed")

    with pytest.raises(ValueError, match="forward failed"):
        masks.during([Matched(Slow())], forward)
    assert done == [[1, 2]]  # `during` returned only after the thread was done
    masks.close()


def test_disabled_prefetch_runs_nothing():
    called = []

    class Recorded:
        def prefetch(self, drafts):
            called.append(drafts)

    masks = MaskPrefetch(enabled=False)
    assert masks.during([Matched(Recorded())], lambda: "x") == "x"
    assert called == []
