"""CUDA graphs for decode passes (langrt/model/cuda_graph.py), as far as a CPU can check them.

The bucket ladder, the padding of a batch to its bucket, the flags and when graphs are off run
here directly. The replay path itself runs in a subprocess with TRITON_INTERPRET=1: the Triton
attention backend on CPU tensors, and `RerunGraph` standing in for a CUDA graph (a replay reruns
the captured function over the same static buffers and the same frozen attention metadata), so
a replay that read anything but the buffers' current contents gives other hidden states than an
eager pass. tests/numerics/test_gpu_model.py runs real graphs on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from langrt.model.cuda_graph import (
    DEFAULT_MAX_BS,
    NoDecodeGraphs,
    bucket_for,
    graph_buckets,
    graph_max_bs,
    why_no_graphs,
)
from langrt.server_args import ServerArgs

REPO = Path(__file__).resolve().parents[2]
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
            max_position_embeddings=512, vocab_size=256)  # fmt: skip


def test_buckets_end_at_max_bs():
    assert graph_buckets(1) == [1]
    assert graph_buckets(4) == [1, 2, 4]
    assert graph_buckets(10) == [1, 2, 4, 8, 10]
    assert graph_buckets(160)[-1] == 160 and len(graph_buckets(160)) == len(set(graph_buckets(160)))
    with pytest.raises(ValueError, match="--cuda-graph-max-bs must be >= 1"):
        graph_buckets(0)


@pytest.mark.parametrize("size, bucket", [(1, 1), (2, 2), (3, 4), (5, 8), (9, 10), (10, 10), (11, None), (0, None)])
def test_a_batch_takes_the_smallest_bucket_holding_it(size, bucket):
    assert bucket_for(size, graph_buckets(10)) == bucket


def test_max_bs_defaults_and_never_exceeds_the_running_requests():
    assert graph_max_bs(ServerArgs(max_running_requests=1024)) == DEFAULT_MAX_BS
    assert graph_max_bs(ServerArgs(max_running_requests=8)) == 8
    assert graph_max_bs(ServerArgs(max_running_requests=1024, cuda_graph_max_bs=32)) == 32
    with pytest.raises(ValueError, match="--cuda-graph-max-bs must be positive"):
        ServerArgs(cuda_graph_max_bs=0)


def test_flags_parse():
    from langrt.cli import build_parser, server_args_from

    ns = build_parser().parse_args(["generate", "hi", "--disable-cuda-graph", "--cuda-graph-max-bs", "16"])
    args = server_args_from(ns)
    assert args.disable_cuda_graph is True and args.cuda_graph_max_bs == 16
    assert server_args_from(build_parser().parse_args(["generate", "hi"])).disable_cuda_graph is False


def test_graphs_are_on_only_for_the_triton_backend_on_cuda():
    on = ServerArgs(device="cuda", attention_backend="triton")
    assert why_no_graphs(on, None) is None
    assert why_no_graphs(ServerArgs(device="cpu", attention_backend="cpu"), None) == "not on CUDA"
    assert (
        why_no_graphs(ServerArgs(device="cuda", attention_backend="triton", disable_cuda_graph=True), None)
        == "--disable-cuda-graph"
    )
    assert "builds its metadata on the host" in why_no_graphs(
        ServerArgs(device="cuda", attention_backend="torch"), None
    )
    assert (
        why_no_graphs(ServerArgs(device="cuda", attention_backend="triton", enable_torch_compile=True), None)
        == "--enable-torch-compile"
    )
    assert "--tp-size 2" in why_no_graphs(ServerArgs(device="cuda", attention_backend="triton", tp_size=2), object())
    assert why_no_graphs(on, None, impl="transformers") == "--model-impl transformers"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A random tiny Llama without a tokenizer (the runner needs none)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny_graph_llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY)).save_pretrained(path)
    return path


def test_a_cpu_runner_has_no_graphs_and_decodes_as_before(tiny_dir):
    from runner_driver import RunnerDriver, make_runner

    runner = make_runner(tiny_dir, max_total_tokens=256, max_running_requests=4)
    assert isinstance(runner.graphs, NoDecodeGraphs)
    assert runner.kv_pool.available_size == 256, "no slot reserved for padding on CPU"
    driver = RunnerDriver(runner)
    driver.prefill([[1, 2, 3], [4, 5]])
    assert driver.decode([0, 1], [6, 7]).shape == (2, TINY["vocab_size"])


@pytest.fixture(scope="module")
def replay_report(tiny_dir):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, __file__, "--replay-worker", str(tiny_dir)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        pytest.fail(f"the replay worker failed (rc={result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_replays_give_the_eager_hidden_states_for_every_batch_size(replay_report):
    assert replay_report["buckets"] == [1, 2, 4]
    steps = replay_report["steps"]
    assert [s["size"] for s in steps] == [3, 1, 2, 4]
    for step in steps:
        assert step["max_diff"] < 1e-4, step


def test_only_decode_batches_that_fit_a_bucket_replay(replay_report):
    assert replay_report["replays"] == 4
    assert replay_report["extend_replays"] is False and replay_report["five_replays"] is False


def test_padding_writes_only_its_reserved_slot(replay_report):
    assert replay_report["pad_slot_free"] is False, "the padding slot must never be handed out"
    assert replay_report["other_slots_unchanged"] is True


# --- the worker (TRITON_INTERPRET=1) ---------------------------------------------------------------


def _replay_worker(model_dir: str) -> dict:
    from runner_driver import RunnerDriver

    from langrt.model.cuda_graph import DecodeGraphs, RerunGraph
    from langrt.model.forward_batch import ForwardBatch, ForwardMode
    from langrt.model.model_runner import ModelRunner
    from langrt.model.source import ModelSource

    args = ServerArgs(model_path=model_dir, device="cpu", dtype="float32", attention_backend="triton",
                      max_total_tokens=128, max_running_requests=8, cuda_graph_max_bs=4, context_length=32).resolve()  # fmt: skip
    source = ModelSource.resolve(model_dir)
    runner = ModelRunner(args, source, source.model_config(), progress=False)
    graphs = DecodeGraphs(runner, graph_max_bs(args), RerunGraph)
    graphs.capture_all()
    driver = RunnerDriver(runner)
    driver.prefill([[5, 6, 7, 8, 9], [10, 11], list(range(20, 39)), [3]])  # up to 2 key ranges of 16
    report = {"buckets": graphs.buckets, "steps": [], "pad_slot": graphs.pad_slot}
    for indices in ([0, 1, 2], [1], [3, 0], [0, 1, 2, 3]):
        report["steps"].append(_compare_step(runner, graphs, driver, indices))
    report["replays"] = graphs.replays
    ids, slots = torch.tensor([1, 2]), runner.kv_pool.alloc(2)
    extend = ForwardBatch(ForwardMode.EXTEND, ids, torch.tensor([4, 5]), slots, [0], [6], [2])
    report["extend_replays"] = graphs.can_replay(extend)
    five = ForwardBatch(ForwardMode.DECODE, torch.ones(5, dtype=torch.int64), torch.ones(5, dtype=torch.int64),
                        slots.repeat(3)[:5], [0] * 5, [2] * 5, [1] * 5)  # fmt: skip
    report["five_replays"] = graphs.can_replay(five)
    report["pad_slot_free"] = graphs.pad_slot in runner.kv_pool.alloc(runner.kv_pool.available_size).tolist()
    return report


def _compare_step(runner, graphs, driver, indices: list[int]) -> dict:
    """One decode step of the listed sequences, eager then replayed over the same slots; the pool's
    other slots must be untouched by the replay (padding writes its reserved slot only)."""
    from langrt.model.forward_batch import ForwardBatch, ForwardMode

    slots = runner.kv_pool.alloc(len(indices))
    tokens = [7 + i for i in indices]
    for k, i in enumerate(indices):
        runner.req_pool.write(driver.rows[i], len(driver.seqs[i]), slots[k : k + 1])
        driver.seqs[i].append(tokens[k])
    batch = ForwardBatch.build(ForwardMode.DECODE, tokens, slots, [driver.rows[i] for i in indices],
                               [len(driver.seqs[i]) for i in indices], [1] * len(indices), runner.device)  # fmt: skip
    eager = runner.forward(batch)
    pool = runner.kv_pool._buffer.clone()
    replayed = graphs.replay(batch)
    after = runner.kv_pool._buffer
    keep = torch.ones(after.shape[2], dtype=torch.bool)
    keep[slots] = False
    keep[graphs.pad_slot] = False
    unchanged = torch.equal(pool[:, :, keep], after[:, :, keep])
    return {"size": len(indices), "max_diff": (eager - replayed).abs().max().item(), "unchanged": unchanged}


if __name__ == "__main__" and sys.argv[1:2] == ["--replay-worker"]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for runner_driver
    torch.set_num_threads(1)
    out = _replay_worker(sys.argv[2])
    out["other_slots_unchanged"] = all(s.pop("unchanged") for s in out["steps"])
    print(json.dumps(out))
