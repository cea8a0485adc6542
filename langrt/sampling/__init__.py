"""Sampling: request parameters, the batched sampler, penalties and logprobs.

`SamplingParams` is plain Python (the main process uses it without torch); the torch-bound
names load on first use.
"""

from langrt.sampling.sampling_params import SamplingParams

_LAZY = {
    "SamplingBatch": "langrt.sampling.sampler",
    "make_generator": "langrt.sampling.sampler",
    "ban_tokens": "langrt.sampling.penalties",
    "logprobs_of": "langrt.sampling.logprobs",
    "top_logprobs": "langrt.sampling.logprobs",
}

__all__ = ["SamplingParams", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'langrt.sampling' has no attribute {name!r}")
