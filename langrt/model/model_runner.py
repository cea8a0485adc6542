"""ModelRunner: owns the model, the two memory pools and the attention backend.

It runs one ForwardBatch at a time (extend or decode) and turns hidden states into logits; it
knows nothing of requests, sampling or scheduling.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from langrt.cpu_features import describe_path
from langrt.errors import ModelLoadError
from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from langrt.model.attention import create_attention_backend
from langrt.model.config import ModelConfig
from langrt.model.forward_batch import ForwardBatch, ForwardMode
from langrt.model.loader import load_model
from langrt.model.quant import describe_blocks, plain_quantization, serve_gguf_blocks, set_pass as set_quantized_pass
from langrt.model.source import ModelSource
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryPlan:
    context_len: int
    max_total_tokens: int
    max_running_requests: int


class ModelRunner:
    def __init__(self, args: ServerArgs, source: ModelSource, config: ModelConfig, progress: bool = True):
        assert args.device != "auto" and args.dtype != "auto", "ServerArgs.resolve() first"
        self.args = args
        self.config = config
        self.device = torch.device(args.device)
        self.dtype = args.torch_dtype
        if self.device.type == "cpu":
            torch.set_num_threads(args.num_threads)
            from kernels.cpu import isa, unavailable_reason

            logger.info(describe_path(args.dtype, unavailable_reason(), isa()))
        gguf_blocks, why = serve_gguf_blocks(args, source)
        quantize, why_quantized = plain_quantization(args, source)
        if source.is_gguf and args.load_format != "dummy" or quantize:
            logger.info("weights: %s", why_quantized or why)
        self.model = load_model(
            source, config, args.load_format, self.dtype, self.device, seed=args.random_seed, progress=progress,
            compiled=args.enable_torch_compile, gguf_blocks=gguf_blocks, quantize=quantize,
        )  # fmt: skip
        if gguf_blocks or quantize:
            logger.info("weights: %s", describe_blocks(self.model))
        self.plan = plan_memory(args, config, self.dtype)
        self.req_pool = ReqToTokenPool(self.plan.max_running_requests, self.plan.context_len, self.device)
        self.kv_pool = TokenToKVPool(
            self.plan.max_total_tokens, config.num_layers, config.num_kv_heads, config.head_dim, self.dtype, self.device
        )
        self.attn_backend = create_attention_backend(args.attention_backend, config, self.kv_pool, self.req_pool)
        logger.info(
            "model ready: %s %s on %s, KV pool %d tokens, context %d",
            config.model_type, args.dtype, self.device, self.plan.max_total_tokens, self.plan.context_len,
        )  # fmt: skip

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Run the layers over the batch's new tokens, writing their K/V; -> [T, hidden]."""
        attn = self.attn_backend.prepare(batch)
        set_quantized_pass(decode=batch.mode is ForwardMode.DECODE, decoding=batch.decoding)
        return self.model(batch.input_ids, batch.positions, attn)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32."""
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def compute_logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """[K] float32: the logit of token_ids[k] under hidden[rows[k]] (only those)."""
        return self.model.compute_logits_of(hidden, rows, token_ids)


def plan_memory(args: ServerArgs, config: ModelConfig, dtype: torch.dtype) -> MemoryPlan:
    context_len = args.context_length or config.max_position_embeddings
    if context_len > config.max_position_embeddings:
        raise ModelLoadError(
            f"--context-length {context_len} exceeds the model's max_position_embeddings "
            f"({config.max_position_embeddings})"
        )
    per_token = TokenToKVPool.bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim, dtype)
    total = args.max_total_tokens or int(_free_memory(args.device) * args.mem_fraction_static // per_token)
    if total < 16:
        raise ModelLoadError(f"only {total} KV slots fit in memory; lower the model size or raise --max-total-tokens")
    return MemoryPlan(context_len, total, args.max_running_requests)


def _free_memory(device: str) -> int:
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
