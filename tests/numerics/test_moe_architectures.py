"""langrt's mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) give transformers'
float32 logits on tiny random-weight checkpoints written by transformers: a batch of prompts of
mixed lengths, a pass reusing cached prefixes beside a fresh prompt, greedy decode steps, on
the torch attention backend and the CPU kernel's. Each model has 4 experts, top-2, 2 layers;
Qwen2-MoE and Qwen3-MoE make one layer dense (mlp_only_layers), Qwen2-MoE has its shared
expert, OLMoE clamps q/k/v. Then the expert pass itself: grouped by expert it equals a per-token
reference, a decode pass multiplies each chosen expert's matrices once, and in bfloat16 each
architecture's block gives the bits of transformers' block (where the dtype casts happen)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

from langrt.errors import ModelLoadError
from langrt.model.moe import ExpertGroups, MoESettings, dense_layers_of, route, run_experts
from runner_driver import RunnerDriver, make_runner
from tiny_arch import langrt_pieces, max_logit_error, random_prompts, write_tiny_checkpoint

# float32 on both sides; measured worst errors are ~3e-6 (the logits are O(1)).
TOLERANCE = 1e-4
BACKENDS = ("torch", "cpu")
EXPERTS = dict(num_experts_per_tok=2)


def _mixtral(path):
    from transformers import MixtralConfig, MixtralForCausalLM

    return write_tiny_checkpoint(MixtralConfig, MixtralForCausalLM, path, seed=3, num_local_experts=4, **EXPERTS)


def _qwen2_moe(path):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    return write_tiny_checkpoint(
        Qwen2MoeConfig, Qwen2MoeForCausalLM, path, seed=4, num_experts=4, moe_intermediate_size=64,
        shared_expert_intermediate_size=96, mlp_only_layers=[1], **EXPERTS,
    )  # fmt: skip


def _qwen3_moe(path):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return write_tiny_checkpoint(
        Qwen3MoeConfig, Qwen3MoeForCausalLM, path, seed=5, num_experts=4, moe_intermediate_size=64,
        mlp_only_layers=[0], norm_topk_prob=True, head_dim=32, **EXPERTS,
    )  # fmt: skip


def _olmoe(path):
    from transformers import OlmoeConfig, OlmoeForCausalLM

    # q and k come out of their norms at about N(0, 1): a clamp at 1 cuts many values.
    return write_tiny_checkpoint(OlmoeConfig, OlmoeForCausalLM, path, seed=6, num_experts=4, clip_qkv=1.0, **EXPERTS)


MODELS = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe, "olmoe": _olmoe}
HF_NAMES = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "olmoe": "Olmoe"}  # class prefixes


@pytest.fixture(scope="module", params=sorted(MODELS))
def tiny_pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, MODELS[request.param](path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_match_transformers(tiny_pair, backend):
    name, path, hf = tiny_pair
    errors = max_logit_error(hf, langrt_pieces(path, attention_backend=backend))
    assert set(errors) == {"prefill", "prefix_reuse", "decode"}
    assert max(errors.values()) <= TOLERANCE, f"{name} on {backend}: {errors}"


def test_the_loaded_model_is_the_architectures_own(tiny_pair):
    """The registry serves each through its module, in the per-layer loop (the fused C++ layers
    are Llama's dense math), and tensor parallelism refuses it by name."""
    from langrt.model import fused_layers

    name, path, _ = tiny_pair
    model = make_runner(path, max_total_tokens=256, max_running_requests=4).model
    assert type(model).__module__ == f"langrt.model.{name}"
    assert fused_layers.layer_tensors(model) is None
    with pytest.raises(ModelLoadError, match="tensor parallelism does not split mixture-of-experts"):
        model.set_tensor_parallel(SimpleNamespace(size=2))


def test_stacked_expert_tensors_load(tmp_path):
    """A state dict saved as transformers' modules hold it (experts stacked [E, 2I, H] and
    [E, H, I], not one tensor per expert) loads to the same logits."""
    path = tmp_path / "stacked"
    hf = _qwen2_moe(path)
    state = {name: t.contiguous() for name, t in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, path / "model.safetensors")
    errors = max_logit_error(hf, langrt_pieces(path, lengths=(5, 23), decode_steps=1))
    assert max(errors.values()) <= TOLERANCE, errors


def test_a_missing_expert_is_named(tmp_path):
    path = tmp_path / "missing"
    _mixtral(path)
    state = load_file(path / "model.safetensors")
    del state["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(state, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match="missing 1 expert matrices, e.g. layer 1 expert 2's up projection"):
        make_runner(path, max_total_tokens=256, max_running_requests=4)


def test_olmoe_clamp_is_exercised(tmp_path):
    """Guards the OLMoE case above: without the clamp langrt's logits leave transformers'."""
    path = tmp_path / "olmoe"
    hf = _olmoe(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "clip_qkv": None}))
    errors = max_logit_error(hf, langrt_pieces(path, lengths=(5, 23), decode_steps=0))
    assert max(errors.values()) > 100 * TOLERANCE, errors


def test_dense_layers_follow_mlp_only_layers_and_sparse_step():
    assert dense_layers_of({}, 4, 8) == frozenset()
    assert dense_layers_of({"decoder_sparse_step": 2}, 4, 8) == {0, 2}
    assert dense_layers_of({"decoder_sparse_step": 2, "mlp_only_layers": [3]}, 4, 8) == {0, 2, 3}
    assert dense_layers_of({"mlp_only_layers": [1]}, 3, 0) == {0, 1, 2}


def _settings(num_experts: int, top_k: int, renormalize: bool = True) -> MoESettings:
    return MoESettings(num_experts, top_k, expert_size=48, renormalize=renormalize, float32_weights=False)


def _experts(s: MoESettings, hidden: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(s.num_experts, 2 * s.expert_size, hidden, generator=gen) * 0.1
    down = torch.randn(s.num_experts, hidden, s.expert_size, generator=gen) * 0.1
    return gate_up, down


def _per_token_reference(x, weights, ids, gate_up, down):
    """Each token alone through each of its experts, as the models' papers write it."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t], ids[t].tolist()):
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += w * (down[e] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("tokens, num_experts, top_k", [(1, 4, 2), (7, 4, 2), (33, 8, 3), (5, 8, 8)])
def test_grouped_experts_equal_a_per_token_reference(tokens, num_experts, top_k):
    s, hidden = _settings(num_experts, top_k, renormalize=top_k != 3), 64
    gate_up, down = _experts(s, hidden, seed=tokens)
    gen = torch.Generator().manual_seed(100 + tokens)
    x = torch.randn(tokens, hidden, generator=gen)
    weights, ids = route(torch.randn(tokens, num_experts, generator=gen), s)
    if s.renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(tokens))
    got = run_experts(x, weights, ExpertGroups.of(ids, num_experts), gate_up, down)
    torch.testing.assert_close(got, _per_token_reference(x, weights, ids, gate_up, down), rtol=1e-5, atol=1e-5)


class _ExpertProducts(TorchDispatchMode):
    """Counts matrix products reading each expert of stacked [E, rows, cols] tensors."""

    def __init__(self, stacked: dict[str, torch.Tensor]):
        super().__init__()
        self.stacked = stacked
        self.reads: dict[str, list[int]] = {name: [] for name in stacked}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Under inference mode aten.linear arrives whole; elsewhere as mm / addmm.
        if func.overloadpacket in (torch.ops.aten.linear, torch.ops.aten.mm, torch.ops.aten.mv, torch.ops.aten.addmm):
            for arg in (a for a in args if isinstance(a, torch.Tensor)):
                for name, t in self.stacked.items():
                    if arg.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
                        self.reads[name].append(arg.storage_offset() // t[0].numel())
        return func(*args, **(kwargs or {}))


def test_a_decode_pass_multiplies_each_chosen_expert_once(tmp_path):
    """8 sequences decode one token each through a Mixtral of 4 experts, top-2: 16 (token,
    expert) pairs per layer, and each layer's gate_up and down matrices of an expert are read by
    one product each (not once per token that chose it)."""
    path = tmp_path / "mixtral"
    _mixtral(path)
    driver = RunnerDriver(make_runner(path, max_total_tokens=1024, max_running_requests=16))
    last = [x[-1] for x in driver.prefill(random_prompts(9, (3, 5, 8, 13, 2, 9, 4, 6)))]
    stacked = {}
    for i, layer in enumerate(driver.runner.model.layers):
        stacked |= {f"{i}.gate_up": layer.mlp.experts.gate_up, f"{i}.down": layer.mlp.experts.down}
    with _ExpertProducts(stacked) as products:
        driver.decode(list(range(8)), [int(x.argmax()) for x in last])
    for name, experts in products.reads.items():
        assert len(experts) == len(set(experts)), f"{name}: an expert multiplied twice: {experts}"
        assert 2 <= len(experts) <= 4, f"{name}: {experts}"


def _block_pair(arch: str):
    """transformers' MoE block of `arch` (eager experts, bf16, random weights) and langrt's
    SparseMoE holding the same weights."""
    import transformers

    from langrt.model.config import ModelConfig
    from langrt.model.moe import SparseMoE
    from langrt.model.registry import model_class

    dims = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4)
    shared = dict(shared_expert_intermediate_size=64)
    experts = {"mixtral": dict(num_local_experts=4), "qwen2_moe": dict(num_experts=4, **shared)}
    dims |= dict(num_key_value_heads=2, num_experts_per_tok=2, moe_intermediate_size=96)
    config = getattr(transformers, f"{HF_NAMES[arch]}Config")(**dims, **experts.get(arch, dict(num_experts=4)))
    config._experts_implementation = "eager"
    module = __import__(f"transformers.models.{arch}.modeling_{arch}", fromlist=["_"])
    torch.manual_seed(0)
    hf = getattr(module, f"{HF_NAMES[arch]}SparseMoeBlock")(config).to(torch.bfloat16)
    with torch.no_grad():
        for param in hf.parameters():
            param.copy_(0.1 * torch.randn_like(param))
    ours = _langrt_block(SparseMoE, ModelConfig.from_hf_dict(config.to_dict()), model_class(arch), hf.state_dict())
    return hf, ours


def _langrt_block(block_cls, config, model_cls, state):
    block = block_cls(config, model_cls.moe_settings(config)).to(torch.bfloat16)
    with torch.no_grad():
        block.gate.weight.copy_(state["gate.weight"])
        block.experts.gate_up.copy_(state["experts.gate_up_proj"])
        block.experts.down.copy_(state["experts.down_proj"])
        if block.shared_expert is not None:
            block.shared_expert_gate.weight.copy_(state["shared_expert_gate.weight"])
            gate_up = torch.cat([state["shared_expert.gate_proj.weight"], state["shared_expert.up_proj.weight"]])
            block.shared_expert.gate_up_proj.weight.copy_(gate_up)
            block.shared_expert.down_proj.weight.copy_(state["shared_expert.down_proj.weight"])
    return block


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_bf16_block_gives_transformers_bits(arch):
    """In bfloat16 the routing weights' dtype matters (float32 into Mixtral's products, bf16 into
    the others'): with the same weights langrt's block gives transformers' bits. Casting the
    other way changes some (checked: by 2^-7 and 2^-8 on Mixtral and Qwen2-MoE)."""
    hf, ours = _block_pair(arch)
    x = 0.5 * torch.randn(16, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.inference_mode():
        _, ids = route(torch.nn.functional.linear(x, ours.gate.weight), ours.settings)
        # Every expert hit takes 2+ rows, so both sides run the same GEMMs (one row would be a GEMV here).
        assert min(ExpertGroups.of(ids, ours.settings.num_experts).counts) >= 2
        expected = hf(x[None]).reshape(16, 64)
        assert torch.equal(ours(x), expected)


# On a CUDA GPU (scripts/gpu_check.sh can add `-k cuda` of this file): the same models through the
# Triton attention backend and the CUDA kernels, against transformers on the GPU. No tokenizer
# (the built-in model is not carried to a lent GPU): the runner takes token ids.
CUDA_DEVICE = "cuda"  # a module constant so the harness can be dry-run on CPU


def _untokenized_checkpoint(arch: str, path) -> torch.nn.Module:
    """MODELS[arch]'s model, saved without the tokenizer; -> the transformers model."""
    import transformers
    from tiny_arch import TINY_DIMS

    qwen = dict(num_experts=4, moe_intermediate_size=64)
    kwargs = {
        "mixtral": dict(num_local_experts=4), "olmoe": dict(num_experts=4, clip_qkv=1.0),
        "qwen2_moe": dict(qwen, shared_expert_intermediate_size=96, mlp_only_layers=[1]),
        "qwen3_moe": dict(qwen, mlp_only_layers=[0], norm_topk_prob=True, head_dim=32),
    }[arch]  # fmt: skip
    config = getattr(transformers, f"{HF_NAMES[arch]}Config")(**TINY_DIMS, num_experts_per_tok=2, **kwargs)
    torch.manual_seed(0)
    model = getattr(transformers, f"{HF_NAMES[arch]}ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_((1.0 if "norm" in name else 0.0) + 0.08 * torch.randn_like(param))
    model.save_pretrained(path)
    return model


def _device_runner(path, backend: str):
    from langrt.model.model_runner import ModelRunner
    from langrt.model.source import ModelSource
    from langrt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(path), device=CUDA_DEVICE, dtype="float32", attention_backend=backend,
        max_total_tokens=4096, max_running_requests=16, log_level="warning",
    ).resolve()  # fmt: skip
    source = ModelSource.resolve(args.model_path)
    return ModelRunner(args, source, source.model_config(), progress=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_cuda_logits_match_transformers(arch, tmp_path, backend: str = "triton"):
    hf = _untokenized_checkpoint(arch, tmp_path).to(CUDA_DEVICE)
    driver = RunnerDriver(_device_runner(tmp_path, backend))
    prompts = random_prompts(11, (5, 23, 41))
    pieces = list(zip(prompts, driver.prefill(prompts), (0, 0, 0)))
    reused = [prompts[0] + prompts[2][:7], prompts[1][:9] + prompts[0][:4]]
    pieces += zip(reused, driver.prefill(reused, prefix_from=[(0, 5), (1, 9)]), (5, 9))
    last = [logits[-1] for _, logits, _ in pieces[-2:]]
    for _ in range(3):
        step = driver.decode([3, 4], [int(x.argmax()) for x in last])
        last = list(step)
        pieces += [(list(driver.seqs[i]), x[None], len(driver.seqs[i]) - 1) for i, x in zip((3, 4), last)]
    worst = 0.0
    with torch.no_grad():
        for ids, logits, start in pieces:
            expected = hf(torch.tensor([ids], device=CUDA_DEVICE)).logits[0, start:].float()
            worst = max(worst, (logits.float() - expected).abs().max().item())
    assert worst <= 2e-3, f"{arch}: {worst}"  # float32; the GPU's reductions differ from transformers' order
