"""Sampling: request parameters, the batched sampler, penalties and logprobs."""

from langrt.sampling.logprobs import logprobs_of, top_logprobs
from langrt.sampling.penalties import ban_tokens
from langrt.sampling.sampler import SamplingBatch, make_generator
from langrt.sampling.sampling_params import SamplingParams

__all__ = [
    "SamplingBatch",
    "SamplingParams",
    "ban_tokens",
    "logprobs_of",
    "make_generator",
    "top_logprobs",
]
