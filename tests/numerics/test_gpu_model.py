"""On a CUDA GPU: the Triton attention backend against the torch one, langrt's logits against
transformers', and decode passes replayed as CUDA graphs against eager ones, in float32 and
bfloat16, on a random Llama-shape model (no tokenizer: the runner takes token ids, so nothing
here needs the built-in model, which is too large to carry to a lent GPU).

Skipped without CUDA; scripts/gpu_check.sh runs it on a lent GPU. With LANGRT_GPU_REPORT set to a
file, each test appends its measured differences there (one JSON object a line).

Weights: embeddings N(0, 1), layer matrices of std 0.7 / sqrt(fan_in) so the residual stream neither
explodes nor vanishes over the layers, and an LM head giving logits of std ~4. With 0.08 std
everywhere (the CPU tests' tiny models) bfloat16 rounding alone moved logits by up to 3.5 on
this shape; with these, bfloat16 against float32 moves them by at most ~0.16, and two bfloat16
implementations (transformers' sdpa and eager attention; langrt's torch backend and
transformers) differ by at most 0.125 (measured on CPU over a 700-token prompt), so TOL's
bounds separate rounding from a wrong kernel (float32 is held tightly). Two bfloat16 runs may
still pick different greedy tokens at a near-tie (5% of positions have their top two logits
within 0.06): `agree` allows that, and checks the logits up to the first divergence.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPE = dict(
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    vocab_size=4096,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)  # fmt: skip  (head_dim 64, 4 query heads per KV head: Llama-3's ratios)
# Largest |logit difference| allowed between two implementations (logits have std ~4).
TOL = {"float32": 2e-3, "bfloat16": 0.5}
DTYPES = ["float32", "bfloat16"]
PROMPT_LENS = (5, 23, 12, 700)  # the 700-token prompt takes several key ranges in the decode kernel
GRAPH_PROMPT_LENS = (5, 23, 12, 700, 1, 9, 2000, 31, 17, 64)  # the 2000-token one: 8 ranges eagerly, 16 in graphs
STEPS = 8
DEVICE = "cuda"  # a module constant so the harness can be dry-run on CPU (TRITON_INTERPRET=1)


def _record(test: str, **values) -> None:
    path = os.environ.get("LANGRT_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, **values}) + "\n")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("gpu_llama")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif "embed" in name:
                param.copy_(torch.randn_like(param))
            else:
                scale = 4.0 if "lm_head" in name else 0.7
                param.copy_(torch.randn_like(param) * scale / param.shape[1] ** 0.5)
    model.save_pretrained(path)
    return path


def make_runner(path, dtype: str, backend: str = "triton", graphs: bool = True, **kw):
    from langrt.model.model_runner import ModelRunner
    from langrt.model.source import ModelSource
    from langrt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(path), device=DEVICE, dtype=dtype, attention_backend=backend, disable_cuda_graph=not graphs,
        max_total_tokens=16384, max_running_requests=16, log_level="warning", **kw,
    ).resolve()  # fmt: skip
    source = ModelSource.resolve(args.model_path)
    return ModelRunner(args, source, source.model_config(), progress=False)


def prompts(lengths=None, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, SHAPE["vocab_size"], (n,), generator=gen).tolist() for n in lengths or PROMPT_LENS]


def greedy(runner, steps: int = STEPS) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill PROMPT_LENS plus one prompt on another's cached prefix, decode all greedily;
    -> (tokens per sequence, [S, V] float32 CPU logits per step)."""
    from runner_driver import RunnerDriver

    driver = RunnerDriver(runner)
    ps = prompts()
    last = [x[-1] for x in driver.prefill(ps)]
    shared = min(20, len(ps[1]) - 1)
    last += [x[-1] for x in driver.prefill([ps[1][:shared] + ps[2][:7]], prefix_from=[(1, shared)])]
    logits = [torch.stack(last).float().cpu()]
    tokens = [[int(row.argmax())] for row in logits[0]]
    for _ in range(steps):
        step = driver.decode(list(range(len(tokens))), [t[-1] for t in tokens]).float().cpu()
        logits.append(step)
        for t, row in zip(tokens, step):
            t.append(int(row.argmax()))
    return tokens, logits


def agree(ref, other, tol: float) -> dict:
    """Greedy runs `ref` and `other` ((tokens, logits) of `greedy`) agree: each sequence has the
    same tokens, or its first different token came where the logits, within tol of each other,
    had a near-tie; up to and at that step, every logit within tol. -> what was measured."""
    (ref_tokens, ref_logits), (tokens, logits) = ref, other
    worst, diverged = 0.0, 0
    for s, (a, b) in enumerate(zip(ref_tokens, tokens)):
        first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        diverged += first < len(a)
        for k in range(min(first + 1, len(a))):
            worst = max(worst, (ref_logits[k][s] - logits[k][s]).abs().max().item())
    assert worst <= tol, f"logits differ by {worst} (> {tol}) before the sequences diverge"
    return {"max_logit_diff": worst, "diverged_sequences": diverged, "sequences": len(ref_tokens)}


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_and_torch_backends_agree_greedily(model_dir, dtype):
    triton = greedy(make_runner(model_dir, dtype, "triton", graphs=False))
    torch_ = greedy(make_runner(model_dir, dtype, "torch", graphs=False))
    measured = agree(torch_, triton, TOL[dtype])
    _record("backends", dtype=dtype, **measured)
    if dtype == "float32":
        assert measured["diverged_sequences"] == 0
        assert triton[0] == torch_[0]


def _hf(model_dir, dtype: str):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(DEVICE).eval()


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids], device=DEVICE)).logits[0].float().cpu()


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_match_transformers(model_dir, dtype, graphs):
    """Prefill of ragged prompts (every position), then decode steps of all of them at once
    (a batch of 4: replayed in the graph of 4 when graphs are on) against HF on the whole sequence."""
    from runner_driver import RunnerDriver

    hf = _hf(model_dir, dtype)
    runner = make_runner(model_dir, dtype, graphs=graphs)
    driver = RunnerDriver(runner)
    ps = prompts(seed=1)
    worst = 0.0
    for prompt, logits in zip(ps, driver.prefill(ps)):
        worst = max(worst, (logits.float().cpu() - _hf_logits(hf, prompt)).abs().max().item())
    gen = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        tokens = torch.randint(0, SHAPE["vocab_size"], (len(ps),), generator=gen).tolist()
        step = driver.decode(list(range(len(ps))), tokens).float().cpu()
        for k, seq in enumerate(driver.seqs):
            worst = max(worst, (step[k] - _hf_logits(hf, seq)[-1]).abs().max().item())
    _record("transformers", dtype=dtype, graphs=graphs, max_logit_diff=worst, replays=runner.graphs.replays)
    assert worst <= TOL[dtype]
    assert runner.graphs.replays == (STEPS if graphs else 0)


def test_graphs_are_on_by_default_on_cuda(model_dir):
    from langrt.model.cuda_graph import DecodeGraphs

    runner = make_runner(model_dir, "bfloat16")
    assert isinstance(runner.graphs, DecodeGraphs)
    assert runner.graphs.buckets == [1, 2, 4, 8, 12, 16]  # up to --max-running-requests 16
    assert runner.kv_pool.available_size == runner.plan.max_total_tokens - 1  # the padding slot


@pytest.mark.parametrize("dtype", DTYPES)
def test_graph_replays_give_the_eager_logits(model_dir, dtype):
    """The same decode steps, teacher-forced, with graphs (up to 8 requests) and without: batches
    of 1, 3, 5 and 8 replay (3 and 5 padded), 10 runs eagerly; and the KV the requests wrote."""
    from runner_driver import RunnerDriver

    on, off = make_runner(model_dir, dtype, cuda_graph_max_bs=8), make_runner(model_dir, dtype, graphs=False)
    drivers = RunnerDriver(on), RunnerDriver(off)
    ps = prompts(GRAPH_PROMPT_LENS, seed=3)
    for d in drivers:
        d.prefill(ps)
    worst, gen = 0.0, torch.Generator().manual_seed(4)
    for size in (1, 3, 5, 8, 10, 3, 1):
        indices = torch.randperm(len(ps), generator=gen)[:size].tolist()
        tokens = torch.randint(0, SHAPE["vocab_size"], (size,), generator=gen).tolist()
        a, b = (d.decode(indices, tokens).float().cpu() for d in drivers)
        worst = max(worst, (a - b).abs().max().item())
    assert on.graphs.replays == 6 and off.graphs.replays == 0
    kv = _request_kv_diff(on, off, drivers[0])
    _record("graphs", dtype=dtype, max_logit_diff=worst, kv_max_diff=kv, pad_slot=on.graphs.pad_slot)
    assert worst <= TOL[dtype] and kv <= TOL[dtype]


def _request_kv_diff(on, off, driver) -> float:
    """Largest difference between the two runners' K/V over every request's positions (each
    runner's own slots: the one with graphs reserved one for padding, which no request may hold)."""
    worst = 0.0
    for row, seq in zip(driver.rows, driver.seqs):
        slots_on = on.req_pool.slots(row, len(seq))
        assert on.graphs.pad_slot not in slots_on.tolist()
        slots_off = off.req_pool.slots(row, len(seq))
        for layer in range(on.config.num_layers):
            for a, b in ((on.kv_pool.k_buffers, off.kv_pool.k_buffers), (on.kv_pool.v_buffers, off.kv_pool.v_buffers)):
                worst = max(worst, (a[layer][slots_on].float() - b[layer][slots_off].float()).abs().max().item())
    return worst


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_outputs_are_the_same_with_and_without_graphs(model_dir, dtype):
    with_graphs = greedy(make_runner(model_dir, dtype))
    without = greedy(make_runner(model_dir, dtype, graphs=False))
    measured = agree(without, with_graphs, TOL[dtype])
    _record("graphs_greedy", dtype=dtype, **measured)
    if dtype == "float32":
        assert with_graphs[0] == without[0]


def test_a_model_that_waits_on_the_host_mid_pass_decodes_without_graphs(tmp_path, caplog):
    """Mixtral's MoE layers count each expert's rows on the host: no capture is tried, the pool
    keeps every slot, and decoding runs eagerly."""
    import logging

    from transformers import MixtralConfig

    from langrt.model.cuda_graph import NoDecodeGraphs
    from runner_driver import RunnerDriver

    config = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=512,
                           max_position_embeddings=512)  # fmt: skip
    config.to_json_file(tmp_path / "config.json")  # dummy weights: no checkpoint format involved
    caplog.set_level(logging.INFO, logger="langrt.model.cuda_graph")
    runner = make_runner(tmp_path, "float32", load_format="dummy")
    assert isinstance(runner.graphs, NoDecodeGraphs)
    assert "synchronizes with the host" in caplog.text
    assert runner.kv_pool.available_size == runner.plan.max_total_tokens
    driver = RunnerDriver(runner)
    driver.prefill([[1, 2, 3], [4, 5]])
    assert torch.isfinite(driver.decode([0, 1], [6, 7])).all()
