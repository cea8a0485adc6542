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
from langrt.mem.window_pool import HybridKVPool, KVSplit, uses_window_pool
from langrt.model.attention import create_attention_backend
from langrt.model.config import ModelConfig
from langrt.model.cuda_graph import create_decode_graphs
from langrt.model.forward_batch import ForwardBatch, ForwardMode
from langrt.model.loader import load_model
from langrt.model.lora_pass import LoraPass
from langrt.model.quant import PassContext, QuantPass, attach_pass_context
from langrt.model.quant_choice import describe_blocks, plain_quantization, serve_gguf_blocks
from langrt.model.source import ModelSource
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


# What the start-up log says serves the model (ModelConfig.impl, set by --model-impl).
_IMPL_NAMES = {"langrt": "langrt's native module", "transformers": "its transformers code, langrt's paged attention"}


@dataclass(frozen=True)
class MemoryPlan:
    context_len: int
    max_total_tokens: int
    max_running_requests: int
    # slots of the sliding-window layers' own pool (mem/window_pool.py); 0: no such pool, every
    # layer keeps every token's K/V in the one pool
    window_tokens: int = 0


class ModelRunner:
    """Under `--tp-size N` (`tp` given) each rank's runner holds its part of the model and pools
    (langrt.parallel); rank 0's also tells the other ranks what to run before each step of its own."""

    def __init__(self, args: ServerArgs, source: ModelSource, config: ModelConfig, progress: bool = True, tp=None):
        assert args.device != "auto" and args.dtype != "auto", "ServerArgs.resolve() first"
        self.args = args
        self.config = config  # the whole model's; `model_config` is this rank's part
        self.tp, self.peers, model_config, shard = _tensor_parallel(tp, config, args.torch_dtype)
        self.device = torch.device(args.device)
        self.dtype = args.torch_dtype
        self.cpu_path: str | None = None  # the CPU kernels' path in words (get_server_info's cpu_path)
        if self.device.type == "cpu":
            torch.set_num_threads(args.num_threads)
            from langrt_kernels.cpu import isa, unavailable_reason

            self.cpu_path = describe_path(args.dtype, unavailable_reason(), isa())
            logger.info(self.cpu_path)
        self.model = self._load(args, source, model_config, shard, progress)
        # the pass running now, as the quantized weights route their products (set per pass)
        self.pass_context = PassContext()
        attach_pass_context(self.model, self.pass_context)
        self.plan = plan_memory(args, config, self.dtype, self.tp)
        # A request's positions each hold a slot of the pool at once, so none is longer than the
        # pool: rows that long (not the whole context's, 34 MB at 32k x 256 rows) suffice.
        positions = min(self.plan.context_len, self.plan.max_total_tokens)
        self.req_pool = ReqToTokenPool(self.plan.max_running_requests, positions, self.device)
        self.kv_pool = _kv_pool(self.plan, model_config, self.dtype, self.device)
        self.attn_backend = create_attention_backend(args.attention_backend, model_config, self.kv_pool, self.req_pool)
        self.graphs = create_decode_graphs(self)  # NoDecodeGraphs off CUDA or with --disable-cuda-graph
        logger.info(
            "model ready: %s (%s) %s on %s, KV pool %d tokens%s, context %d",
            config.model_type,
            _IMPL_NAMES[config.impl],
            args.dtype,
            self.device,
            self.plan.max_total_tokens,
            _window_note(self.plan, config),
            self.plan.context_len,
        )

    def _load(self, args: ServerArgs, source: ModelSource, model_config: ModelConfig, shard, progress: bool):
        """This rank's model, its weights served as the arguments and the file ask (logged)."""
        gguf_blocks, why = serve_gguf_blocks(args, source)
        quantize, why_quantized = plain_quantization(args, source)
        if source.is_gguf and args.load_format != "dummy" or quantize:
            logger.info("weights: %s", why_quantized or why)
        model = load_model(
            source,
            model_config,
            args.load_format,
            self.dtype,
            self.device,
            seed=args.random_seed,
            progress=progress,
            compiled=args.enable_torch_compile,
            gguf_blocks=gguf_blocks,
            quantize=quantize,
            shard=shard,
            tp=self.tp,
            dense_copy=args.cpu_dense_copy,
        )
        if gguf_blocks or quantize:
            logger.info("weights: %s", describe_blocks(model))
        return model

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Run the layers over the batch's new tokens, writing their K/V; -> [T, hidden]."""
        if self.peers is not None:
            self.peers.forward(batch, self.req_pool.req_to_token)
        if batch.adapters is None and self.graphs.can_replay(batch):
            return self.graphs.replay(batch)
        attn = self.attn_backend.prepare(batch)
        self.pass_context.quant = QuantPass.of(decode=batch.mode is ForwardMode.DECODE, decoding=batch.decoding)
        if batch.adapters is None:
            return self.model(batch.input_ids, batch.positions, attn)
        lora = LoraPass.build(batch.adapters, batch.extend_lens, self.device)
        return self.model(batch.input_ids, batch.positions, attn, lora=lora)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32 (under tensor parallelism: on rank 0; None elsewhere)."""
        if self.peers is not None:
            self.peers.logits(hidden)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def compute_logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """[K] float32: the logit of token_ids[k] under hidden[rows[k]] (only those)."""
        if self.peers is not None:  # the other ranks get the rows asked for, each once
            used, rows = rows.unique(return_inverse=True)
            hidden = hidden.index_select(0, used)
            self.peers.logits_of(hidden, rows, token_ids)
        return self.model.compute_logits_of(hidden, rows, token_ids)


def _tensor_parallel(tp, config: ModelConfig, dtype: torch.dtype):
    """(tp, rank 0's sender or None, this rank's config, the weights' sharding or None); the
    group (langrt.parallel.group.TensorParallel) decides this rank's part."""
    if tp is None:
        return None, None, config, None
    peers, local_config, shard = tp.take_part(config, dtype)
    return tp, peers, local_config, shard


def _layer_windows(config: ModelConfig) -> tuple[int | None, ...]:
    return tuple(config.window_of(i) for i in range(config.num_layers))


def _kv_pool(plan: MemoryPlan, config: ModelConfig, dtype: torch.dtype, device: torch.device):
    """One pool for every layer, or (plan.window_tokens) full layers' and window layers' apart."""
    if plan.window_tokens:
        return HybridKVPool(
            plan.max_total_tokens,
            plan.window_tokens,
            _layer_windows(config),
            config.num_kv_heads,
            config.head_dim,
            dtype,
            device,
        )
    return TokenToKVPool(plan.max_total_tokens, config.num_layers, config.num_kv_heads, config.head_dim, dtype, device)


def _window_note(plan: MemoryPlan, config: ModelConfig) -> str:
    if not plan.window_tokens:
        return ""
    sliding = sum(w is not None for w in _layer_windows(config))
    return (
        f" (the {config.num_layers - sliding} full-attention layers' K/V), sliding-window pool {plan.window_tokens} "
        f"tokens (the {sliding} window layers' K/V, only each request's last window)"
    )


def plan_memory(args: ServerArgs, config: ModelConfig, dtype: torch.dtype, tp=None) -> MemoryPlan:
    """Pool sizes; under tensor parallelism every rank's pool has the same slots (the fewest any
    rank's memory holds), counting every rank's KV heads where they share the machine's RAM."""
    context_len = args.context_length or config.max_position_embeddings
    if context_len > config.max_position_embeddings:
        raise ModelLoadError(
            f"--context-length {context_len} exceeds the model's max_position_embeddings "
            f"({config.max_position_embeddings})"
        )
    kv_heads = config.num_kv_heads if tp is None else tp.layout.kv_heads_in_memory(config, args.device == "cpu")
    # Under tensor parallelism each rank's pool follows rank 0's slots without its window map:
    # there every layer keeps every token's K/V.
    if tp is None and uses_window_pool(_layer_windows(config), context_len):
        split = KVSplit.of(_layer_windows(config), kv_heads, config.head_dim, dtype)
        total = args.max_total_tokens or split.full_slots(_free_memory(args.device) * args.mem_fraction_static)
        _check_fits(total)
        return MemoryPlan(context_len, total, args.max_running_requests, split.window_slots(total))
    per_token = TokenToKVPool.bytes_per_token(config.num_layers, kv_heads, config.head_dim, dtype)
    total = args.max_total_tokens or int(_free_memory(args.device) * args.mem_fraction_static // per_token)
    if tp is not None:
        total = tp.min_int(total)
    _check_fits(total)
    return MemoryPlan(context_len, total, args.max_running_requests)


def _check_fits(total: int) -> None:
    if total < 16:
        raise ModelLoadError(f"only {total} KV slots fit in memory; lower the model size or raise --max-total-tokens")


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
