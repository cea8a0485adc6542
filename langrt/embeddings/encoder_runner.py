"""EncoderRunner: an encoder model (BERT family) and its pooling, in the scheduler process.

An encoder sees each input whole in one pass and keeps nothing afterwards, so it needs no KV pool
and no radix cache: a batch of inputs is sorted by length, cut into passes of at most
`max_batch_tokens` padded tokens, and each pass returns its pooled vectors.
"""

from __future__ import annotations

import json
import logging

import torch

from langrt.embeddings.pooling import Pooling
from langrt.model.config import ModelConfig
from langrt.model.loader import _default_dtype, _fill_dummy
from langrt.model.registry import model_class
from langrt.model.source import ModelSource
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# What sentence-transformers does for a BERT without its own settings: mean of the tokens.
ENCODER_DEFAULT_POOLING = Pooling("mean", normalize=False)


class EncoderRunner:
    def __init__(self, args: ServerArgs, source: ModelSource, config: ModelConfig):
        self.config = config
        self.device = torch.device(args.device)
        self.dtype = args.torch_dtype
        self.max_batch_tokens = max(args.chunked_prefill_size, config.max_position_embeddings)
        trained = _max_seq_length(source) or config.max_position_embeddings
        self.context_len = min(args.context_length or trained, config.max_position_embeddings)
        with torch.device(self.device), _default_dtype(self.dtype):
            self.model = model_class(config.model_type)(config)
        self.model.set_tensor_parallel(None)
        if args.load_format == "dummy":
            _fill_dummy(self.model, args.random_seed)
        else:
            self.model.load_weights(source.iter_weights(self.dtype, progress=False))
        self.model.eval().requires_grad_(False)
        self.pooling = Pooling.of_model(source.path, args.pooling, ENCODER_DEFAULT_POOLING)
        logger.info(
            "encoder ready: %s %s on %s, pooling %s%s",
            config.model_type,
            args.dtype,
            self.device,
            self.pooling.mode,
            " + normalize" if self.pooling.normalize else "",
        )

    @property
    def dimensions(self) -> int:
        return self.config.hidden_size

    @torch.inference_mode()
    def encode(self, inputs: list[list[int]]) -> torch.Tensor:
        """Token id lists -> [N, hidden] float32 vectors, in the order given."""
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
        out = torch.empty(len(inputs), self.dimensions)
        start = 0
        while start < len(order):
            end = start + 1
            # sorted ascending: the pass's padded size is its last input's length times its count
            while end < len(order) and len(inputs[order[end]]) * (end + 1 - start) <= self.max_batch_tokens:
                end += 1
            rows = order[start:end]
            out[rows] = self._pass([inputs[i] for i in rows]).cpu()
            start = end
        return out

    def _pass(self, inputs: list[list[int]]) -> torch.Tensor:
        width = max(len(ids) for ids in inputs)
        ids = torch.zeros(len(inputs), width, dtype=torch.long)
        mask = torch.zeros(len(inputs), width, dtype=torch.bool)
        for row, tokens in enumerate(inputs):
            ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = True
        ids, mask = ids.to(self.device), mask.to(self.device)
        return self.pooling(self.model(ids, mask), mask)


def _max_seq_length(source: ModelSource) -> int | None:
    """sentence-transformers' `max_seq_length` (sentence_bert_config.json): the longest input the
    model was trained on, which sentence-transformers cuts inputs to; langrt refuses longer ones."""
    settings = source.path / "sentence_bert_config.json"
    if not settings.is_file():
        return None
    value = json.loads(settings.read_text()).get("max_seq_length")
    return int(value) if value else None
