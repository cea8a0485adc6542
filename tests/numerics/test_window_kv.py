"""Gemma 3's sliding-window layers keep only their window's K/V (mem/window_pool.py), and its
logits still equal transformers'.

A tiny random Gemma 3 (window 8 on two of its three layers) runs through a CacheManager the way
the scheduler drives it: prompts longer than the window, prefilled in chunks beside each other,
then greedy decode steps; then prompts that continue a cached sequence (its window K/V kept at
its end) and one that shares only a mid-prompt prefix whose window K/V was dropped (the cache
offers less of it: computed again). Every pass's logits are held to transformers' over the whole
sequence, and between passes each request holds at most 2 x window window slots of its own:
its private tokens' last window and its cached prompt's last window. Then the scheduler
end to end: greedy outputs equal transformers' generate, with chunked prefill and prefix reuse.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # run as the Triton worker script, too
from langrt.mem.cache_manager import CacheManager
from langrt.mem.window_pool import HybridKVPool
from langrt.model.forward_batch import ForwardBatch, ForwardMode
from runner_driver import make_runner, make_scheduler, run_requests
from tiny_arch import Piece, max_logit_error, random_prompts, write_tiny_checkpoint

WINDOW = 8
TOLERANCE = 1e-4  # float32 both sides, as tests/numerics/test_architectures.py


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    path = tmp_path_factory.mktemp("gemma3_window")
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    hf = write_tiny_checkpoint(
        Gemma3TextConfig, Gemma3ForCausalLM, path, seed=3, num_hidden_layers=3, num_key_value_heads=1, head_dim=32,
        sliding_window=WINDOW, layer_types=layer_types, query_pre_attn_scalar=24,
    )  # fmt: skip
    return path, hf


@dataclass
class Seq:
    """A request as CacheManager sees one."""

    all_ids: list[int]
    kv_len: int = 0
    cached_len: int = 0
    cache_node: object = None
    kv_row: int | None = None

    @property
    def cache_ids(self) -> list[int]:
        """The ids its cached prefixes are keyed by (no adapter prefix)."""
        return self.all_ids


class CachedDriver:
    def __init__(self, runner):
        self.runner = runner
        self.cm = CacheManager.for_runner(runner, radix=True, eager_window_drop=True)
        self.pool: HybridKVPool = runner.kv_pool

    def admit(self, ids: list[int]) -> Seq:
        seq = Seq(list(ids))
        assert self.cm.open(seq, self.cm.match(ids[:-1]))
        return seq

    def run(self, work: list[tuple[Seq, int]], phase: str) -> list[Piece]:
        """Compute the next n positions of each seq in one pass; -> their logits."""
        ids, slots, rows, lens, ext = [], [], [], [], []
        for seq, n in work:
            assert self.cm.reserve(seq, seq.kv_len, n)
            ids += seq.all_ids[seq.kv_len : seq.kv_len + n]
            slots.append(self.cm.slots(seq, seq.kv_len, seq.kv_len + n))
            rows, lens, ext = rows + [seq.kv_row], lens + [seq.kv_len + n], ext + [n]
        mode = ForwardMode.DECODE if set(ext) == {1} else ForwardMode.EXTEND
        batch = ForwardBatch.build(mode, ids, torch.cat(slots), rows, lens, ext, self.runner.device)
        logits = self.runner.compute_logits(self.runner.forward(batch))
        pieces = []
        for (seq, n), start in zip(work, batch.extend_starts):
            pieces.append(Piece(phase, list(seq.all_ids[: seq.kv_len + n]), seq.kv_len, logits[start : start + n]))
            seq.kv_len += n
        return pieces

    def window_held(self, seq: Seq) -> int:
        """Window slots named by seq's positions."""
        return int((self.pool.full_to_window[self.cm.slots(seq, 0, seq.kv_len)] >= 0).sum())


def _prefill_and_decode(driver: CachedDriver, prompts: list[list[int]], chunk: int, steps: int) -> list[Piece]:
    seqs = [driver.admit(p) for p in prompts]
    pieces = []
    while any(s.kv_len < len(s.all_ids) for s in seqs):
        work = [(s, min(chunk, len(s.all_ids) - s.kv_len)) for s in seqs if s.kv_len < len(s.all_ids)]
        pieces += driver.run(work, "prefill")
        for seq, _ in work:
            driver.cm.share(seq)
        _check_window_held(driver, seqs)
    for _ in range(steps):
        for seq, piece in zip(seqs, pieces[-len(seqs) :]):
            seq.all_ids.append(int(piece.logits[-1].argmax()))
        pieces += driver.run([(s, 1) for s in seqs], "decode")
        for seq in seqs:
            driver.cm.trim(seq, seq.kv_len)
        _check_window_held(driver, seqs)
    for seq in seqs:
        driver.cm.release(seq)
    return pieces


def _check_window_held(driver: CachedDriver, seqs: list[Seq]) -> None:
    held = [driver.window_held(s) for s in seqs]
    assert max(held) <= 2 * WINDOW, held
    assert driver.pool.window_slots_in_use() == sum(held), "window slots no running request names"


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_window_pool_logits_equal_transformers(gemma3, backend, caplog):
    path, hf = gemma3
    with caplog.at_level(logging.INFO, logger="langrt.model.model_runner"):
        runner = make_runner(path, max_total_tokens=512, max_running_requests=4, attention_backend=backend)
    assert isinstance(runner.kv_pool, HybridKVPool) and runner.plan.window_tokens == 128
    # a quarter of 512, but at least four windows of 8; the log names both pools
    assert "KV pool 512 tokens (the 1 full-attention layers' K/V), sliding-window pool 128 tokens" in caplog.text
    driver = CachedDriver(runner)
    a, b = random_prompts(7, (30, 19))
    pieces = _prefill_and_decode(driver, [a, b], chunk=12, steps=12)
    a_done = pieces[-2].ids  # a's prompt and its 12 outputs: cached, window K/V kept at its end

    new = random_prompts(8, (5, 6, 4))
    follow_up, mid_prompt, same_prompt = a_done + new[0], a[:20] + new[1], a + new[2]
    tree = driver.cm._prefixes.tree
    assert tree.match_prefix(mid_prompt).length == 20  # cached, but its window K/V at 12..19 was dropped
    seqs = [driver.admit(ids) for ids in (follow_up, mid_prompt, same_prompt)]
    # where a's window K/V was kept: the end of a's sequence, and of its prompt; mid-prompt: none
    assert [s.cached_len for s in seqs] == [len(a_done), 0, len(a)]
    pieces += driver.run([(s, len(s.all_ids) - s.kv_len) for s in seqs], "prefix_reuse")
    errors = max_logit_error(hf, pieces)
    assert set(errors) == {"prefill", "decode", "prefix_reuse"}
    assert max(errors.values()) <= TOLERANCE, errors


def test_scheduler_output_equals_transformers_generate(gemma3):
    """Chunked prefill (12 tokens a pass) over prompts of 3-4 windows, greedy decode past more;
    run twice: the second round reuses the cached prompts and gives the same tokens."""
    from langrt.sampling.sampling_params import SamplingParams
    from langrt.request import Req

    path, hf = gemma3
    prompts = random_prompts(11, (27, 33, 21))
    with torch.no_grad():
        expected = [
            hf.generate(torch.tensor([p]), max_new_tokens=14, do_sample=False)[0, len(p) :].tolist() for p in prompts
        ]
    scheduler = make_scheduler(path, max_total_tokens=512, max_running_requests=4, chunked_prefill_size=12)
    for round_ in range(2):
        reqs = [Req(f"r{round_}{i}", list(p), SamplingParams(max_new_tokens=14, temperature=0, ignore_eos=True))
                for i, p in enumerate(prompts)]  # fmt: skip
        assert run_requests(scheduler, reqs) == expected
        stats = scheduler.cache_stats()
        assert stats["kv_window_total_tokens"] == 128
    assert all(r.cached_tokens > 0 for r in reqs)


def test_triton_backend_reads_the_window_pool(gemma3):
    """The Triton kernels (in Triton's interpreter, in a subprocess: TRITON_INTERPRET=1 must not
    leak into this process) read the window layers through window slots: the logits of a
    chunked prefill and decode steps with window K/V dropped equal the torch backend's."""
    import json
    import os
    import subprocess

    path, _ = gemma3
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, __file__, "--triton-worker", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=Path(__file__).parents[2], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["backends"] == ["torch", "triton"] and result["pieces"] == 10  # 4 prompt chunks, 6 decodes
    assert result["max_logit_diff"] < 1e-3, result
    # decode graphs (RerunGraph standing in for CUDA's): each replay maps the rows to window
    # slots again, as the window drops move on
    assert result["graph_steps"] == 12 and result["graph_max_diff"] < 1e-4, result


def _backend_logits(path: str, backend: str) -> list[torch.Tensor]:
    runner = make_runner(path, max_total_tokens=256, max_running_requests=2, attention_backend=backend)
    driver = CachedDriver(runner)
    pieces = _prefill_and_decode(driver, random_prompts(7, (22, 13)), chunk=12, steps=3)
    return [p.logits for p in pieces]


def _graph_replay_diffs(path: str) -> list[float]:
    """Decode steps eager and replayed from a graph captured before any request ran."""
    from langrt.model.cuda_graph import DecodeGraphs, RerunGraph, graph_max_bs

    runner = make_runner(path, max_total_tokens=256, max_running_requests=4, attention_backend="triton",
                         cuda_graph_max_bs=2, context_length=64)  # fmt: skip
    graphs = DecodeGraphs(runner, graph_max_bs(runner.args), RerunGraph)
    graphs.capture_all()
    driver = CachedDriver(runner)
    seqs = [driver.admit(p) for p in random_prompts(7, (22, 13))]
    driver.run([(s, len(s.all_ids)) for s in seqs], "prefill")
    diffs = []
    for step in range(12):
        for seq in seqs:
            seq.all_ids.append(20 + step)
            assert driver.cm.reserve(seq, seq.kv_len, 1)
        slots = torch.cat([driver.cm.slots(s, s.kv_len, s.kv_len + 1) for s in seqs])
        batch = ForwardBatch.build(ForwardMode.DECODE, [s.all_ids[-1] for s in seqs], slots, [s.kv_row for s in seqs],
                                   [s.kv_len + 1 for s in seqs], [1, 1], runner.device)  # fmt: skip
        diffs.append((runner.forward(batch) - graphs.replay(batch)).abs().max().item())
        for seq in seqs:
            seq.kv_len += 1
            driver.cm.trim(seq, seq.kv_len)
    assert graphs.replays == 12
    return diffs


if __name__ == "__main__" and sys.argv[1:2] == ["--triton-worker"]:
    import json

    torch_logits, triton_logits = (_backend_logits(sys.argv[2], b) for b in ("torch", "triton"))
    diff = max((a - b).abs().max().item() for a, b in zip(torch_logits, triton_logits, strict=True))
    graph_diffs = _graph_replay_diffs(sys.argv[2])
    print(json.dumps({"backends": ["torch", "triton"], "pieces": len(torch_logits), "max_logit_diff": diff,
                      "graph_steps": len(graph_diffs), "graph_max_diff": max(graph_diffs)}))  # fmt: skip
