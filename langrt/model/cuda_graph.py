"""CUDA graphs for decode passes: each batch-size bucket's forward captured once, replayed after.

A batch-1 decode of an 8B model launches ~400 kernels; replaying them as one graph takes the
host's launch time out of the step. A graph replays fixed addresses and fixed launch arguments,
so everything a pass varies lives in static device buffers that are refilled before each replay:
the token ids, positions and KV slots ([3, max_bs] int64) and the attention's request rows and
lengths ([2, max_bs] int32). A batch of B requests runs the graph of the smallest bucket >= B;
rows B.. are padding: token 0 at position 0, one key (req_to_token[0, 0], some valid slot),
writing its K/V into a slot reserved for padding that no request ever owns. Row results do not
depend on other rows (attention is per request), so the first B rows are the batch's answer.

Only the Triton attention backend takes graphs (its decode kernel reads request rows and lengths
from device tensors, and the number of key ranges is fixed per bucket for the longest context);
the torch backend builds its masks on the host every pass. Tensor parallelism (collectives),
--enable-torch-compile, --model-impl transformers and models whose forward waits on the GPU
mid-pass (the MoE layers count each expert's rows on the host; `DecodeGraphs.host_sync` finds
such a wait before any capture) run eagerly. `--disable-cuda-graph` turns graphs off; CPU runs
never have them.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Callable

import torch

from langrt.model.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from langrt.model.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# Why 160: SGLang's default largest captured batch on GPUs of this class; past it a decode
# pass's matmuls are large enough that launch time no longer matters. Every bucket's graph
# shares one memory pool, so the largest bucket sets the memory graphs hold.
DEFAULT_MAX_BS = 160
_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160, 192, 224, 256)


def graph_buckets(max_bs: int) -> list[int]:
    """Captured batch sizes up to max_bs: the fixed ladder, plus max_bs itself so it is the top."""
    if max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs must be >= 1; got {max_bs}")
    return sorted({b for b in _BUCKETS if b < max_bs} | {max_bs})


def bucket_for(batch_size: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding batch_size, or None when it exceeds the largest (run eagerly)."""
    i = bisect.bisect_left(buckets, batch_size)
    return buckets[i] if i < len(buckets) and batch_size >= 1 else None


def graph_max_bs(args) -> int:
    """--cuda-graph-max-bs, else DEFAULT_MAX_BS; never more requests than can run together."""
    return min(args.cuda_graph_max_bs or DEFAULT_MAX_BS, args.max_running_requests)


def why_no_graphs(args, tp, impl: str = "langrt") -> str | None:
    """Why this runner's decode passes run eagerly, or None where graphs are captured."""
    if args.device != "cuda":
        return "not on CUDA"
    if impl != "langrt":  # a model's own transformers code may read tensors on the host mid-pass
        return f"--model-impl {impl}"
    if args.disable_cuda_graph:
        return "--disable-cuda-graph"
    if args.attention_backend != "triton":
        return f"--attention-backend {args.attention_backend} builds its metadata on the host every pass (use triton)"
    if tp is not None:
        return f"--tp-size {args.tp_size}: collectives run eagerly"
    if args.enable_torch_compile:
        return "--enable-torch-compile"
    return None


class CudaGraph:
    """One captured pass on the GPU; graphs made by one DecodeGraphs share a memory pool and the
    stream they are captured on."""

    def __init__(self, pool, stream):
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool
        self.stream = stream

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run fn once eagerly on the capture stream (Triton compiles its kernels and cuBLAS sets
        up that stream's workspace there, not inside the capture), then capture it; -> the
        output tensor each replay rewrites."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, pool=self.pool, stream=self.stream):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


class RerunGraph:
    """A stand-in with a graph's contract for CPU tests: `replay` reruns the captured function
    into the same output tensor, so anything the capture froze (the attention's metadata, its
    key ranges) stays frozen and only the static buffers' contents change."""

    def __init__(self, pool=None, stream=None):
        self.fn: Callable[[], torch.Tensor] | None = None
        self.out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fn, self.out = fn, fn()
        return self.out

    def replay(self) -> None:
        self.out.copy_(self.fn())


class NoDecodeGraphs:
    """Graphs off: every pass runs eagerly."""

    replays = 0

    def can_replay(self, batch: ForwardBatch) -> bool:
        return False


class DecodeGraphs:
    """Static buffers and one captured decode pass per bucket, over a runner's model and pools.

    Contract: `capture_all()` once, after the model's weights are final and before any request
    uses the pools (it writes only the reserved padding slot); then `replay(batch)` for any batch
    that `can_replay` accepts. The returned hidden states are a copy (the graph's output buffer
    is rewritten by the next replay)."""

    def __init__(self, runner: ModelRunner, max_bs: int, graph_factory=CudaGraph):
        self.model = runner.model
        self.backend = runner.attn_backend
        self.buckets = graph_buckets(max_bs)
        self.device = runner.device
        pad = runner.kv_pool.alloc(1)  # the padding rows' K/V go here, never to a request's slot
        if pad is None:
            raise RuntimeError("the KV pool has no slot left to reserve for CUDA graph padding")
        self.pad_slot = int(pad[0])
        top = self.buckets[-1]
        self.tokens = torch.zeros((3, top), dtype=torch.int64, device=self.device)  # ids, positions, slots
        self.tokens[2].fill_(self.pad_slot)
        self.meta = torch.ones((2, top), dtype=torch.int32, device=self.device)  # request rows, lengths
        self.meta[0].zero_()
        self._padding = torch.tensor([[0], [0], [self.pad_slot]], dtype=torch.int64, device=self.device)
        self.num_kv_splits = {b: self._splits(b, runner.plan.context_len) for b in self.buckets}
        on_gpu = graph_factory is CudaGraph
        pool, stream = (torch.cuda.graph_pool_handle(), torch.cuda.Stream(self.device)) if on_gpu else (None, None)
        self.graphs = {b: graph_factory(pool, stream) for b in self.buckets}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0

    def _splits(self, bucket: int, context_len: int) -> int:
        """Key ranges per sequence, fixed at capture: what an eager pass picks for the longest context."""
        kernels = self.backend.decode_kernels
        return kernels.default_num_kv_splits(bucket, self.backend.num_kv_heads, context_len, self.device)

    @torch.inference_mode()
    def host_sync(self) -> str | None:
        """Why a pass cannot be captured: the first op of an eager one-request pass that waits for
        the GPU (a `.tolist()` of expert counts in an MoE layer, say), or None. Run with torch's
        sync debug mode set to raise, before any capture: a sync inside a capture would break it
        (and leave the CUDA context in error), while here it only raises before it happens."""
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            self._pass(1)()
        except RuntimeError as error:  # the debug mode's report of the synchronizing op
            return f"the model's forward synchronizes with the host: {str(error).splitlines()[0][:200]}"
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        return None

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every bucket, largest first (the smaller graphs then fit in its pool memory)."""
        for bucket in reversed(self.buckets):
            try:
                self.outputs[bucket] = self.graphs[bucket].capture(self._pass(bucket))
            except Exception as error:
                raise RuntimeError(
                    f"CUDA graph capture of a decode pass of {bucket} requests failed ({type(error).__name__}: {error}); "
                    "run with --disable-cuda-graph to decode without graphs"
                ) from error
        logger.info(
            "CUDA graphs: decode batches of up to %d requests captured (%d sizes)", self.buckets[-1], len(self.buckets)
        )

    def _pass(self, bucket: int) -> Callable[[], torch.Tensor]:
        """The forward of a bucket-sized decode pass over the static buffers' first `bucket` columns."""
        ids, positions, slots = self.tokens[:, :bucket]
        rows, lens = self.meta[:, :bucket]
        batch = ForwardBatch(
            ForwardMode.DECODE, ids, positions, slots, [0] * bucket, [1] * bucket, [1] * bucket, decoding=True
        )  # the host lists only describe the shape; the kernels read rows and lengths from `meta`
        attn = self.backend.prepare_graph_decode(batch, rows, lens, self.num_kv_splits[bucket])
        return lambda: self.model(ids, positions, attn)

    def can_replay(self, batch: ForwardBatch) -> bool:
        return batch.mode is ForwardMode.DECODE and bucket_for(batch.batch_size, self.buckets) is not None

    @torch.inference_mode()
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """The batch's hidden states [B, hidden], by the replay of its bucket's graph."""
        n = batch.batch_size
        bucket = bucket_for(n, self.buckets)
        self.tokens[0, :n].copy_(batch.input_ids)
        self.tokens[1, :n].copy_(batch.positions)
        self.tokens[2, :n].copy_(batch.out_cache_loc)
        self.tokens[:, n:bucket] = self._padding
        meta = torch.tensor([batch.req_pool_indices, batch.seq_lens], dtype=torch.int32)
        self.meta[:, :n].copy_(meta)
        self.meta[0, n:bucket] = 0
        self.meta[1, n:bucket] = 1
        self.graphs[bucket].replay()
        self.replays += 1
        return self.outputs[bucket][:n].clone()


def create_decode_graphs(runner: ModelRunner, graph_factory=CudaGraph) -> DecodeGraphs | NoDecodeGraphs:
    """The runner's decode graphs, captured now; NoDecodeGraphs (with the reason logged) where off."""
    why = why_no_graphs(runner.args, runner.tp, runner.config.impl)
    if why is None:
        graphs = DecodeGraphs(runner, graph_max_bs(runner.args), graph_factory)
        why = graphs.host_sync() if graph_factory is CudaGraph else None
        if why is None:
            graphs.capture_all()
            return graphs
        runner.kv_pool.free(torch.tensor([graphs.pad_slot]))  # the padding slot, back to the pool
    if runner.args.device == "cuda":
        logger.info("CUDA graphs: off (%s)", why)
    return NoDecodeGraphs()
