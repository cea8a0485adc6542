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


def kernels_package():
    """langrt's top-level `kernels` package, refusing a same-named package from elsewhere."""
    import importlib

    module = importlib.import_module("kernels")
    if not getattr(module, "LANGRT_KERNELS", False):
        raise ImportError(
            f"the 'kernels' module at {getattr(module, '__file__', '?')} is not langrt's (another "
            "distribution installs a top-level 'kernels'); uninstall it or reinstall langrt"
        )
    return module
