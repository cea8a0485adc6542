"""GGUF files (llama.cpp's format): metadata, an HF-style config, dequantized weights, tokenizer.

The header is read by `gguf_reader`; tensor data is never read until `iter_weights` asks for
it; dequantization uses `gguf.quants`.

Layout facts the code relies on:
- GGUF lists dims innermost first (ne0 = row length), so a tensor's torch shape is the reverse:
  `token_embd.weight` with dims [hidden, vocab] is HF's `embed_tokens.weight` [vocab, hidden].
- llama.cpp's converter permutes the rows of attn_q / attn_k (weights and biases) of Llama-arch
  models, turning each head's "first half / second half" rotary layout into interleaved pairs.
  `_unpermute_rows` undoes it; the other architectures are stored unpermuted.
- Each architecture's tensor names, config keys and storage quirks are in `gguf_archs`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import gguf
import numpy as np

from langrt.errors import ModelLoadError
from langrt.model import registry
from langrt.model.gguf_archs import ARCHITECTURES, MISTRAL, MIXTRAL, GGUFArch, hf_parameters
from langrt.model.gguf_shapes import expected_shape
from langrt.model.gguf_reader import GGUFTensorInfo, read_header

if TYPE_CHECKING:
    import torch


# GGUF tensor names outside the layers -> HF parameter names (every architecture).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Matrices one fused projection of langrt's model holds: served as blocks only if all are blocks
# (of one type or several: langrt.model.quant.StackedQuantizedWeight).
# A mixture-of-experts layer fuses each expert's gate and up, and its shared expert's.
_FUSED_GROUPS = (
    ("attn_q", "attn_k", "attn_v"),
    ("ffn_gate", "ffn_up"),
    ("ffn_gate_exps", "ffn_up_exps"),
    ("ffn_gate_shexp", "ffn_up_shexp"),
)
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# llama.cpp's converter assumes this when a llama3-scaled config does not say (convert_hf_to_gguf.py).
_LLAMA3_DEFAULT_ORIGINAL_CONTEXT = 8192


class GGUFFile:
    """A GGUF model file, memory-mapped, of an architecture langrt serves natively
    (registry.Arch.gguf; its format facts in gguf_archs)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._mm, self.metadata, tensors = read_header(self.path)
        self.tensors: dict[str, GGUFTensorInfo] = {t.name: t for t in tensors}
        self.architecture = self.metadata.get("general.architecture")
        self.arch = self._arch()

    def _arch(self) -> GGUFArch:
        served = sorted(set(registry.gguf_architectures()) & set(ARCHITECTURES))
        if self.architecture not in served:
            raise ModelLoadError(
                f"{self.path}: GGUF architecture {self.architecture!r} is not supported; langrt loads "
                f"GGUF files of {served} (or convert the model to an HF directory and pass "
                "--model-impl transformers)"
            )
        name = f"{self.metadata.get('general.name', '')} {self.metadata.get('general.basename', '')}"
        if self.architecture == "llama" and (self.arch_key("expert_count") or 0) > 0:
            return MIXTRAL  # llama.cpp stores Mixtral as a Llama with experts
        if self.architecture == "llama" and "mistral" in name.lower():
            return MISTRAL
        return ARCHITECTURES[self.architecture]

    @property
    def num_tensors(self) -> int:
        """How many tensors `iter_weights` yields: the file's tensors less non-parameters (rope
        factors), a stacked experts tensor counting once per expert."""
        parameters = [t for name, t in self.tensors.items() if name not in self.arch.non_parameters]
        return sum(t.shape[0] if "_exps." in t.name else 1 for t in parameters)

    @property
    def chat_template(self) -> str | None:
        """The file's template; else the architecture's own (Gemma's base-model files carry none)."""
        return self.metadata.get("tokenizer.chat_template") or self.arch.default_chat_template

    def arch_key(self, key: str, default: Any = None) -> Any:
        """Metadata key `key` of this file's architecture (`<arch>.<key>`)."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def vector(self, name: str) -> list[float] | None:
        """A 1-D tensor's values (rope factors), None where the file has no such tensor."""
        info = self.tensors.get(name)
        return None if info is None else self._tensor(info, "float32").tolist()

    @property
    def hf_config(self) -> dict[str, Any]:
        """The model's config as HF's config.json would have it (a fresh copy on each access)."""
        return copy.deepcopy(self._hf_config)

    @cached_property
    def _hf_config(self) -> dict[str, Any]:
        required = ("embedding_length", "block_count", "attention.head_count", "feed_forward_length")
        bad = [k for k in required if not isinstance(self.arch_key(k), int) or self.arch_key(k) <= 0]
        if bad:
            keys = ", ".join(f"{self.architecture}.{key}" for key in bad)
            raise ModelLoadError(f"{self.path}: the metadata lacks a positive {keys}, so the model's shape is unknown")
        hidden = self.arch_key("embedding_length")
        heads = self.arch_key("attention.head_count")
        embed = self.tensors.get("token_embd.weight")
        if embed is None:
            raise ModelLoadError(f"{self.path}: no token_embd.weight tensor")
        has_bias = any(f"blk.0.attn_{p}.bias" in self.tensors for p in "qkv")
        config = {
            "model_type": self.arch.model_type,
            "architectures": [self.arch.hf_class],
            "vocab_size": embed.shape[0],
            "hidden_size": hidden,
            "intermediate_size": self.arch_key("feed_forward_length"),
            "num_hidden_layers": self.arch_key("block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": self.arch_key("attention.head_count_kv", heads),
            "head_dim": self.arch_key("attention.key_length", hidden // heads),
            "hidden_act": "silu",
            "rms_norm_eps": _shortest_float(self.arch_key("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self.arch_key("rope.freq_base", 10000.0)),
            "rope_scaling": self._rope_scaling(),
            "max_position_embeddings": self.arch_key("context_length", 2048),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "attention_bias": has_bias,
            "bos_token_id": self.metadata.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self._eos_token_ids(),
            "torch_dtype": self._torch_dtype_name(),
        }
        return config if self.arch.config_hook is None else self.arch.config_hook(self, config)

    def _eos_token_ids(self) -> int | list[int] | None:
        """EOS, and the architecture's end-of-turn tokens where the vocabulary has them (Gemma's
        <end_of_turn>: its HF generation_config lists both; llama.cpp stops on both too)."""
        eos = self.metadata.get("tokenizer.ggml.eos_token_id")
        tokens = self.metadata.get("tokenizer.ggml.tokens") or []
        extra = [tokens.index(t) for t in self.arch.end_of_turn if t in tokens]
        ids = [i for i in (eos, *extra) if i is not None]
        return ids[0] if len(ids) == 1 else (ids or None)

    def _torch_dtype_name(self) -> str:
        """float32 / bfloat16 for files stored in them; float16 for F16 and for quantized files,
        whose block scales are fp16."""
        kinds = {gguf.GGMLQuantizationType(t.ggml_type) for t in self.tensors.values() if len(t.shape) == 2}
        if kinds <= {gguf.GGMLQuantizationType.F32}:
            return "float32"
        if kinds <= {gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F32}:
            return "bfloat16"
        return "float16"

    def _rope_scaling(self) -> dict[str, Any] | None:
        scaling_type = self.arch_key("rope.scaling.type")
        factor = self.arch_key("rope.scaling.factor")
        original = self.arch_key("rope.scaling.original_context_length")
        if "rope_freqs.weight" in self.tensors and "rope_freqs.weight" in self.arch.non_parameters:
            factors = self._tensor(self.tensors["rope_freqs.weight"], "float64").numpy()
            head_dim = self.arch_key("rope.dimension_count") or 2 * len(factors)
            base = float(self.arch_key("rope.freq_base", 10000.0))
            return _llama3_rope_scaling(factors, base, head_dim, original or _LLAMA3_DEFAULT_ORIGINAL_CONTEXT)
        if scaling_type in (None, "none") or factor is None:
            return None
        scaling: dict[str, Any] = {"rope_type": scaling_type, "factor": float(factor)}
        if original is not None:
            scaling["original_max_position_embeddings"] = original
        return scaling

    def iter_weights(self, dtype: torch.dtype, quantized: bool = False) -> Iterator[tuple[str, Any]]:
        """(HF parameter name, tensor in `dtype`) for every parameter tensor, in file order.

        With `quantized`, matrices stored in blocks the CPU kernels take come as QuantizedWeight
        (their blocks, not dequantized), where every matrix fused with it (q/k/v, gate/up) has
        the same type. Each tensor owns its memory. `lm_head.weight` comes only from a file that
        has `output.weight`; a tied model (`hf_config["tie_word_embeddings"]`) has none.
        """

        config = self._hf_config
        permuted = self.arch.permuted
        head_counts = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
        for info in self.tensors.values():
            if info.name in self.arch.non_parameters:
                continue
            name = self._hf_name(info.name)
            expected = expected_shape(name, config)
            if info.shape != expected:
                raise ModelLoadError(
                    f"{self.path}: tensor {info.name} has shape {list(info.shape)}, but the metadata "
                    f"describes a model whose {name} is {list(expected)}"
                )
            if quantized and info.name in self._block_tensors:
                tensor = self._blocks(info)
            elif self.arch.norm_offset and name.endswith("norm.weight"):
                # Stored as offset + w (Gemma's 1 + w): subtract in float32, before any rounding.
                tensor = (self._tensor(info, "float32") - self.arch.norm_offset).to(dtype)
            else:
                tensor = self._tensor(info, dtype)
            proj = name.rsplit(".", 2)[-2]
            if permuted and proj in head_counts:
                tensor = _unpermute(tensor, head_counts[proj])
            yield from hf_parameters(name, tensor)

    def _hf_name(self, gguf_name: str) -> str:
        if gguf_name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[gguf_name]
        match = _LAYER_TENSOR.fullmatch(gguf_name)
        if match is None or match.group(2) not in self.arch.layer_names:
            raise ModelLoadError(
                f"{self.path}: tensor {gguf_name} has no counterpart in an HF {self.arch.hf_class}; "
                "this GGUF may be a variant langrt does not load"
            )
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{self.arch.layer_names[part]}.{kind}"

    @cached_property
    def _block_tensors(self) -> set[str]:
        """Names of the matrices served as stored blocks (see iter_weights); logs, once, every
        quantized tensor expanded to floats instead, and why (gguf_blocks)."""
        from langrt.model.gguf_blocks import kept_as_blocks

        layers = range(self._hf_config["num_hidden_layers"])
        groups = [[f"blk.{layer}.{part}.weight" for part in group] for layer in layers for group in _FUSED_GROUPS]
        return kept_as_blocks(self.tensors.values(), groups, str(self.path))

    def _blocks(self, info: GGUFTensorInfo):
        """A quantized matrix as its blocks (a copy out of the mapping, one row per output); a
        stacked experts tensor [E, rows, cols] as a list of E such matrices (its bytes are the
        experts' matrices one after another)."""
        import torch

        from langrt.model.quant import QuantizedWeight

        rows = math.prod(info.shape[:-1])
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        data = torch.from_numpy(raw.reshape(rows, info.nbytes // rows))  # a view: repacking copies it
        if len(info.shape) == 2:
            return QuantizedWeight.from_gguf(data, info.ggml_type, info.shape[-1])
        return [QuantizedWeight.from_gguf(m, info.ggml_type, info.shape[-1]) for m in data.split(info.shape[1])]

    def _tensor(self, info: GGUFTensorInfo, dtype: torch.dtype | str) -> torch.Tensor:
        import torch  # heavy: only where weights are read

        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        qtype = gguf.GGMLQuantizationType(info.ggml_type)
        native = _NATIVE_FLOATS.get(qtype)
        if native is not None:
            # Stored floats: reinterpret in place, and copy once (into `dtype`) out of the mapping.
            return torch.from_numpy(raw).view(getattr(torch, native)).reshape(info.shape).to(dtype, copy=True)
        byte_shape = (*info.shape[:-1], info.nbytes // max(1, math.prod(info.shape[:-1])))
        try:
            values = gguf.quants.dequantize(raw.reshape(byte_shape), qtype)
        except NotImplementedError:
            raise ModelLoadError(
                f"{self.path}: tensor {info.name} is stored as {qtype.name}, which gguf.quants cannot "
                "dequantize; re-quantize the model to a supported type (e.g. Q8_0, Q4_K, F16)"
            ) from None
        return torch.from_numpy(values).reshape(info.shape).to(dtype)


_NATIVE_FLOATS = {  # read as these torch dtypes directly (exact)
    gguf.GGMLQuantizationType.F32: "float32",
    gguf.GGMLQuantizationType.F16: "float16",
    gguf.GGMLQuantizationType.BF16: "bfloat16",
}


def _shortest_float(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-5, not 9.99999974738e-06)."""
    return float(np.format_float_positional(np.float32(value), unique=True))


def _unpermute(w: Any, n_heads: int) -> Any:
    """_unpermute_rows on a tensor, or on a QuantizedWeight's rows of blocks (rows are whole)."""
    from langrt.model.quant import QuantizedWeight  # imports torch: only where weights are read

    if isinstance(w, QuantizedWeight):
        return dataclasses.replace(w, data=_unpermute_rows(w.data, n_heads))
    return _unpermute_rows(w, n_heads)


def _unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (convert_hf_to_gguf.py `LlamaModel.permute`).

    Within each head the converter reorders rows from (pair j of half 0..1, index i) to
    (index i, half j): row j*half + i moves to 2*i + j. Here rows go back.
    """

    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _llama3_rope_scaling(factors: np.ndarray, base: float, head_dim: int, original: int) -> dict[str, Any] | None:
    """Recover HF's llama3 `rope_scaling` from the per-frequency factors llama.cpp stores.

    The converter writes f_i = 1 (short wavelengths), `factor` (long ones) or, in between,
    1 / ((1 - s_i) / factor + s_i) with s_i = (original / wavelen_i - low) / (high - low).
    Each in-between f_i gives one linear equation in (low, high); solve them by least squares.
    """
    factor = float(factors.max())
    if factor <= 1.0 + 1e-6:
        return None
    wavelens = 2 * math.pi * base ** (np.arange(0, head_dim, 2, dtype=np.float64)[: len(factors)] / head_dim)
    mid = (factors > 1 + 1e-4) & (factors < factor * (1 - 1e-4))
    low, high = 1.0, 4.0  # Llama 3.1's values: used when too few in-between factors pin them down
    if mid.sum() >= 2:
        s = (1 / factors[mid] - 1 / factor) / (1 - 1 / factor)
        a = np.stack([1 - s, s], axis=1)
        (low, high), *_ = np.linalg.lstsq(a, original / wavelens[mid], rcond=None)
    return {
        "rope_type": "llama3",
        "factor": round(factor, 4),
        "low_freq_factor": round(float(low), 3),
        "high_freq_factor": round(float(high), 3),
        "original_max_position_embeddings": int(original),
    }
