"""Models langrt has no module for, run by their own transformers code (--model-impl transformers).

As SGLang's and vLLM's `--model-impl transformers`: the checkpoint is loaded by transformers'
`AutoModelForCausalLM` with `attn_implementation` set to langrt's paged attention
(hf_fallback_attention), and its base model runs the pass's new tokens of every request as one
sequence of T tokens at their own positions. Each layer's attention writes its K/V into
langrt's pool and reads the request's cached prefix through it, so prefix caching, continuous
batching, constrained and speculative decoding work as on a native model; the layers' other
math is the model's own. Tensor parallelism and plain-weight quantization are native-only.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from langrt.errors import ModelLoadError
from langrt.model.attention import Attention
from langrt.model.config import ModelConfig
from langrt.model.hf_fallback_attention import ATTN_IMPLEMENTATION, PASS_KWARG, PagedPass
from langrt.model.hf_fallback_config import causal_lm_class
from langrt.model.source import ModelSource

logger = logging.getLogger(__name__)

PROBE_TOKENS = 5  # the load-time pass that checks the model's attention calls and head


class TransformersCausalLM(nn.Module):
    """A transformers causal LM with ModelRunner's interface (see langrt.model.llama)."""

    def __init__(self, hf_model: nn.Module, config: ModelConfig):
        super().__init__()
        self.hf_model = hf_model
        self.head = hf_model.get_output_embeddings()
        self.config = config

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: Attention) -> torch.Tensor:
        """[T] token ids -> [T, hidden] final hidden states (after the base model's last norm)."""
        out = self.hf_model.base_model(
            input_ids=input_ids[None], position_ids=positions[None], use_cache=False, **{PASS_KWARG: self._pass(attn)}
        )
        return out.last_hidden_state[0]

    def full_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: Attention) -> torch.Tensor:
        """[T, vocab] float32 logits by the model's own causal-LM forward (its head included)."""
        out = self.hf_model(
            input_ids=input_ids[None], position_ids=positions[None], use_cache=False, **{PASS_KWARG: self._pass(attn)}
        )
        return out.logits[0].float()

    def _pass(self, attn: Attention) -> PagedPass:
        c = self.config
        return PagedPass(attn, c.num_heads, c.num_kv_heads, c.head_dim, c.softmax_scale, c.layer_windows)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.head.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32."""
        return self.head(hidden).float()

    def compute_logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """[K] float32: the logit of token_ids[k] under hidden[rows[k]], accumulated in float32
        and rounded to the model's dtype as compute_logits rounds it."""
        weight = self.head.weight.index_select(0, token_ids).float()
        dots = (weight * hidden.index_select(0, rows).float()).sum(dim=-1)
        if self.head.bias is not None:
            dots = dots + self.head.bias.index_select(0, token_ids).float()
        return dots.to(hidden.dtype).float()

    def set_tensor_parallel(self, tp) -> None:
        if tp is not None:
            raise ModelLoadError(
                f"--tp-size > 1: {self.config.model_type} runs through its transformers code, which langrt does not "
                "split over ranks; serve it with --tp-size 1 (or --dp-size N for replicas)"
            )

    def pack_for_cpu(self, dense_budget: int = 0) -> bool:
        """The model's own Linear layers run as they are: nothing to pack."""
        return False

    def quantize_weights(self, layer_type: int, head_type: int) -> None:
        raise ModelLoadError(
            f"--quantization int8/int4: {self.config.model_type} runs through its transformers code, whose weights "
            "langrt does not quantize; use --quantization auto or none"
        )


def load_transformers_model(
    source: ModelSource,
    config: ModelConfig,
    load_format: str,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    compiled: bool = False,
    quantize: str | None = None,
    tp=None,
) -> TransformersCausalLM:
    """Load the model with transformers over langrt's attention, in eval mode, checked by one
    probe pass; options langrt applies only to native modules are refused."""
    if compiled:
        raise ModelLoadError(
            f"--enable-torch-compile compiles langrt's native layers; {config.model_type} runs through its "
            "transformers code: leave it off"
        )
    hf_model = _load_hf_model(source, config, load_format, dtype, seed)
    model = TransformersCausalLM(hf_model.to(device), config).eval().requires_grad_(False)
    model.set_tensor_parallel(tp)
    if quantize is not None:
        model.quantize_weights(0, 0)
    check_paged_attention_fits(model)
    import transformers

    logger.info(
        "%s runs through its transformers code (%s, transformers %s) over langrt's paged attention",
        config.model_type,
        type(hf_model).__name__,
        transformers.__version__,
    )
    return model


def _load_hf_model(source: ModelSource, config: ModelConfig, load_format: str, dtype: torch.dtype, seed: int):
    import langrt.model.hf_fallback_attention  # noqa: F401  (registers ATTN_IMPLEMENTATION)
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(source.path, local_files_only=True)
    model_class = causal_lm_class(hf_config)
    try:
        if load_format == "dummy":  # seeded random weights of the model's shape
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                return AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
        return model_class.from_pretrained(
            source.path, config=hf_config, local_files_only=True, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION
        )
    except Exception as e:  # whatever transformers raises, the user needs which model and why
        raise ModelLoadError(f"transformers could not load {config.model_type} from {source.path}: {e}") from e


@torch.inference_mode()
def check_paged_attention_fits(model: TransformersCausalLM) -> None:
    """One pass of a few tokens over a probe attention (causal SDPA): every layer's attention
    call must have langrt's layout and options (hf_fallback_attention refuses others), the
    layers must number 0..L-1 as the KV pool does, and the model's own logits must be
    `compute_logits` of the base model's output (no extra scaling or capping in its head)."""
    c = model.config
    device = model.head.weight.device
    ids = torch.arange(PROBE_TOKENS, device=device) % c.vocab_size
    positions = torch.arange(PROBE_TOKENS, device=device)
    probe = ProbeAttention(c)
    hidden = model(ids, positions, probe)
    if probe.layers != list(range(c.num_layers)):
        raise ModelLoadError(
            f"{c.model_type}: its attention layers were called as {probe.layers}, not once each as 0..{c.num_layers - 1}; "
            "langrt's KV pool holds one entry per layer index"
        )
    ours, theirs = model.compute_logits(hidden), model.full_logits(ids, positions, ProbeAttention(c))
    tolerance = (1e-4 if model.head.weight.dtype == torch.float32 else 2e-2) * max(1.0, theirs.abs().max().item())
    if not torch.allclose(ours, theirs, rtol=0, atol=tolerance):
        raise ModelLoadError(
            f"{c.model_type}: its causal-LM head does more than its output layer (logits differ by "
            f"{(ours - theirs).abs().max().item():.3g}: a scale or cap), which langrt's logits do not apply"
        )


class ProbeAttention(Attention):
    """Plain causal attention over one sequence, recording which layers called it."""

    def __init__(self, config: ModelConfig):
        self.config = config
        self.layers: list[int] = []

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        c, tokens = self.config, q.shape[0]
        self.layers.append(layer_id)
        heads = [x.view(tokens, -1, c.head_dim).transpose(0, 1)[None].float() for x in (q, k, v)]
        out = F.scaled_dot_product_attention(
            *heads, is_causal=True, scale=c.softmax_scale, enable_gqa=c.num_heads != c.num_kv_heads
        )
        return out[0].transpose(0, 1).reshape(tokens, -1).to(q.dtype)
