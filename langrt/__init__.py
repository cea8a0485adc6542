"""langrt: structured-generation programs on a prefix-caching LLM runtime.

Heavy modules (torch, the model) load on first use of `Engine`, so `import langrt` stays cheap.
"""

from langrt.version import __version__

__all__ = ["Engine", "SamplingParams", "ServerArgs", "__version__"]


def __getattr__(name: str):
    if name == "Engine":
        from langrt.engine import Engine

        return Engine
    if name == "SamplingParams":
        from langrt.sampling.sampling_params import SamplingParams

        return SamplingParams
    if name == "ServerArgs":
        from langrt.server_args import ServerArgs

        return ServerArgs
    raise AttributeError(f"module 'langrt' has no attribute {name!r}")
