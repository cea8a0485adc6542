"""Writing GGUF files for tests, the way llama.cpp's convert_hf_to_gguf.py lays them out.

`write_gguf` takes an HF state dict and config and writes llama.cpp's tensor names, its q/k row
permutation for Llama-arch models, and tensors quantized with `gguf.quants.quantize`. This is an
independent implementation of the converter, so reading its output back with `GGUFFile` checks
the loader against the format rather than against itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType

_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LAYER_PARAM = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


def gguf_name(hf_name: str) -> str:
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    layer, module, kind = _LAYER_PARAM.fullmatch(hf_name).groups()
    return f"blk.{layer}.{_LAYER[module]}.{kind}"


def llamacpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's `LlamaModel.permute`: per head, rows [half 0 | half 1] -> interleaved."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode_tensor(values: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    """(array for GGUFWriter.add_tensor, raw type) holding float32 `values` as `qtype`."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype == Q.F32:
        return values, qtype
    if qtype == Q.F16:
        return values.astype(np.float16), qtype
    return gguf.quants.quantize(values, qtype), qtype


def random_k_quant_rows(qtype: Q, n: int, k: int, seed: int) -> np.ndarray:
    """n rows of k weights as random K-quant super-blocks (gguf-py has no quantizer for them):
    random quants, scales and minimums, and fp16 super-block scales that keep the weights near
    +-0.1. uint8 [n, k / 256 * super-block bytes]."""
    rng = np.random.default_rng(seed)
    size = {Q.Q2_K: 84, Q.Q3_K: 110, Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}[qtype]
    raw = rng.integers(0, 256, (n, k // 256, size), dtype=np.uint8)

    def put(offset: int, low: float, high: float) -> None:
        values = rng.uniform(low, high, (n, k // 256, 1)).astype(np.float16)
        raw[..., offset : offset + 2] = values.view(np.uint8)

    # (offset of d, its range), (offset of dmin, its range): the largest quant times the largest
    # sub-block scale times d stays near 0.1
    scales = {
        Q.Q2_K: [(80, 1e-3, 5e-3), (82, 1e-3, 5e-3)],  # 4-bit scales and minimums, 2-bit quants
        Q.Q3_K: [(108, 5e-5, 2e-4)],  # 6-bit scales less 32, quants in [-4, 3]
        Q.Q4_K: [(0, 2e-5, 1e-4), (2, 2e-5, 1e-4)],  # 6-bit scales and minimums, 4-bit quants
        Q.Q5_K: [(0, 1e-5, 5e-5), (2, 2e-5, 1e-4)],  # 5-bit quants
        Q.Q6_K: [(208, 5e-6, 2e-5)],  # int8 scales, quants in [-32, 31]
    }
    for offset, low, high in scales[qtype]:
        put(offset, low, high)
    return raw.reshape(n, -1)


def write_q4_k_m_like(path: str | Path, config: Any, state: Mapping[str, torch.Tensor]) -> Path:
    """Q4_K_M's mix on a Llama-arch model: Q4_K attention and gate/up, Q6_K down projections and
    output, and in layer 0 a Q6_K v projection beside Q4_K q and k (as llama.cpp gives some
    layers more bits); a Q8_0 embedding. Random super-blocks (see random_k_quant_rows)."""

    def pick(name: str) -> Q:
        more_bits = "down_proj" in name or name == "lm_head.weight" or "layers.0.self_attn.v_proj" in name
        return Q.Q6_K if more_bits else Q.Q4_K

    return write_mixed(path, config, state, pick)


def write_mixed(path: str | Path, config: Any, state: Mapping[str, torch.Tensor], pick: Callable[[str], Q]) -> Path:
    """Every matrix but the (Q8_0) embedding stored as `pick(hf_name)`: the K-quants as random
    super-blocks (random_k_quant_rows), other types quantized from the state's values by gguf-py
    (q/k rows as they are: a test comparing the blocks with the same file dequantized needs no
    permutation)."""
    raw = {}
    for seed, (name, tensor) in enumerate(state.items()):
        if tensor.dim() == 2 and name != "model.embed_tokens.weight":
            qtype = pick(name)
            if qtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):
                raw[name] = (random_k_quant_rows(qtype, tensor.shape[0], tensor.shape[1], seed), qtype)
            else:
                raw[name] = encode_tensor(tensor.detach().float().numpy(), qtype)
    return write_gguf(path, state, config, Q.Q8_0, raw=raw)


def write_gguf(
    path: str | Path,
    state_dict: Mapping[str, torch.Tensor],
    config: Any,
    qtype: Q = Q.F32,
    *,
    tokenizer_metadata: Mapping[str, Any] | None = None,
    extra_tensors: Mapping[str, np.ndarray] | None = None,
    name: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    raw: Mapping[str, tuple[np.ndarray, Q]] | None = None,
) -> Path:
    """Write an HF Llama / Mistral / Qwen2 model (its state dict and PretrainedConfig) as GGUF.

    Matrices are stored as `qtype`; vectors (norms, biases) as F32, as llama.cpp does. A tied
    `lm_head.weight` is left out. `tokenizer_metadata` holds `tokenizer.*` keys to copy (e.g.
    from the built-in model's file); `metadata` any further keys. `raw` maps HF names to bytes
    written as they are, in their GGUF type (already in llama.cpp's q/k row order); their values
    in `state_dict` are then not used.
    """
    arch = "qwen2" if config.model_type == "qwen2" else "llama"
    permute = arch == "llama"
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name or f"tiny-{config.model_type}")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_rope_dimension_count(head_dim)
    if head_dim != config.hidden_size // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_vocab_size(config.vocab_size)
    for key, value in {**(tokenizer_metadata or {}), **(metadata or {})}.items():
        _add_metadata(writer, key, value)
    tied = getattr(config, "tie_word_embeddings", False)
    for hf_name, tensor in state_dict.items():
        if tied and hf_name == "lm_head.weight":
            continue
        if raw and hf_name in raw:
            data, raw_type = raw[hf_name]
            writer.add_tensor(gguf_name(hf_name), data, raw_dtype=raw_type)
            continue
        values = tensor.detach().to(torch.float32).numpy()
        if permute and ".self_attn.q_proj." in hf_name:
            values = llamacpp_permute(values, heads)
        elif permute and ".self_attn.k_proj." in hf_name:
            values = llamacpp_permute(values, kv_heads)
        data, raw_type = encode_tensor(values, qtype if values.ndim == 2 else Q.F32)
        writer.add_tensor(gguf_name(hf_name), data, raw_dtype=raw_type if raw_type not in (Q.F32, Q.F16) else None)
    for extra_name, values in (extra_tensors or {}).items():
        writer.add_tensor(extra_name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _rope_theta(config: Any) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:  # transformers 5 keeps it in rope_parameters
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def _add_metadata(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def tokenizer_fields(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The `tokenizer.*` entries of a GGUF file's metadata."""
    return {key: value for key, value in metadata.items() if key.startswith("tokenizer.")}


def write_vocab_gguf(path: str | Path, tokenizer_metadata: Mapping[str, Any], arch: str = "llama") -> Path:
    """A vocabulary-only GGUF (no tensors), like llama.cpp's models/ggml-vocab-*.gguf."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in tokenizer_metadata.items():
        _add_metadata(writer, key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


# llama.cpp architectures written by `write_converted_gguf`, by HF model_type.
_CONVERTED_ARCHS = {
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
    "phi3": gguf.MODEL_ARCH.PHI3,
    "qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE,
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "olmoe": gguf.MODEL_ARCH.OLMOE,
    "mixtral": gguf.MODEL_ARCH.LLAMA,  # llama.cpp's Mixtral: a Llama with experts
}


def write_converted_gguf(
    path: str | Path,
    state_dict: Mapping[str, torch.Tensor],
    config: Any,
    qtype: Q = Q.F32,
    *,
    tokenizer_metadata: Mapping[str, Any] | None = None,
    expert_qtype: Q = Q.F32,
) -> Path:
    """Write an HF Qwen3, Gemma 3 (text) or Phi-3 model as llama.cpp's convert_hf_to_gguf.py
    does: tensor names from gguf-py's TensorNameMap (the converter's own table; Phi-3's fused
    qkv and gate_up as attn_qkv and ffn_up), q/k rows unpermuted, Gemma's norm weights stored as
    1 + w, head size as key/value length, the rotated width (Phi-3's partial rotary), the
    sliding window; mixture-of-experts models with each projection's experts stacked
    (ffn_gate_exps / ffn_up_exps / ffn_down_exps, transformers' gate_up_proj split in two), the
    expert counts and sizes, Mixtral's q/k rows permuted as a Llama's. Matrices as `qtype`,
    stacked experts as `expert_qtype` (each expert's rows quantized as a matrix's), routers and
    vectors F32; a tied lm_head left out."""
    arch = _CONVERTED_ARCHS[config.model_type]
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    gemma = arch == gguf.MODEL_ARCH.GEMMA3
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(f"tiny-{config.model_type}")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = config.rope_parameters["full_attention"] if gemma else config.rope_parameters
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(config.sliding_window)
    _add_expert_metadata(writer, config)
    if rope.get("rope_type") == "longrope":  # Phi3MiniModel: the factors as two F32 tensors
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    for key, value in (tokenizer_metadata or {}).items():
        _add_metadata(writer, key, value)
    for hf_name, tensor in state_dict.items():
        if config.tie_word_embeddings and hf_name == "lm_head.weight":
            continue
        for gguf_tensor, values in _converted(hf_name, tensor.detach().to(torch.float32).numpy(), config, names):
            # Routers stay F32, as the converter and llama-quantize keep them.
            kind = Q.F32 if ".ffn_gate_inp." in gguf_tensor else {2: qtype, 3: expert_qtype}.get(values.ndim, Q.F32)
            data, raw_type = encode_tensor(values, kind)
            writer.add_tensor(gguf_tensor, data, raw_dtype=raw_type if raw_type not in (Q.F32, Q.F16) else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _converted(
    hf_name: str, values: np.ndarray, config: Any, names: gguf.TensorNameMap
) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, values) for one HF tensor, as the converter's modify_tensors writes it."""
    if hf_name.endswith(".mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows first
        prefix = names.get_name(hf_name.replace("gate_up_proj", "down_proj")).replace("down", "{}")
        half = values.shape[1] // 2
        return [
            (f"{prefix.format('gate')}.weight", values[:, :half]),
            (f"{prefix.format('up')}.weight", values[:, half:]),
        ]
    if hf_name.endswith(".mlp.experts.down_proj"):
        return [(f"{names.get_name(hf_name)}.weight", values)]
    module, kind = hf_name.rsplit(".", 1)
    if config.model_type == "gemma3_text" and hf_name.endswith("norm.weight"):
        values = values + 1.0  # Gemma3Model.modify_tensors: norm_shift
    if config.model_type == "mixtral" and module.endswith(("self_attn.q_proj", "self_attn.k_proj")):
        heads = config.num_attention_heads if module.endswith("q_proj") else config.num_key_value_heads
        values = llamacpp_permute(values, heads)
    if module.endswith("shared_expert_gate"):
        values = values.reshape(-1)  # llama.cpp keeps it as a vector
    return [(f"{names.get_name(module)}.{kind}", values)]


def _add_expert_metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not experts:
        return
    writer.add_expert_count(experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_feed_forward_length(getattr(config, "moe_intermediate_size", None) or config.intermediate_size)
    if getattr(config, "shared_expert_intermediate_size", None):
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
