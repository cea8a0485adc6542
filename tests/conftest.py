"""Shared fixtures: tiny random-weight HF models on disk, and the built-in model's path.

The tests by layer: unit/ (fast, no model process), numerics/ (the kernels: attention, layers,
bitmask, and the model's logits, against references), e2e/ (a live Engine, server or scheduler
over a model) and reliability/ (the stress runs at CI scale). Helpers shared across layers
(runner_driver, server_utils, gguf_utils) sit here, and this directory is on sys.path for them;
so no folder here may share a name with a package langrt imports.

Tiny models are saved as ordinary HF directories (config.json + safetensors + tokenizer files)
so tests exercise the real loading path. They borrow the built-in model's tokenizer (vocab
49,152), so text round-trips work; random weights give random text, so tests on them assert
structure, never content.
"""

from __future__ import annotations

import os

import pytest
import torch  # noqa: F401 (kept: the session loads torch here first, before any test module, as it always has)

from langrt.builtin import builtin_model_path

# The Triton interpreter is a per-test choice: the kernel tests start it in worker subprocesses
# (TRITON_INTERPRET=1 set there), and test the launchers' refusals in this process, which must
# import triton without it whatever the caller's environment says.
os.environ.pop("TRITON_INTERPRET", None)


def build_tiny_model(kind: str, path, seed: int = 0, **overrides):
    """Save a seeded random tiny `kind` ('llama' | 'qwen2') model with the built-in tokenizer
    (tiny_arch.write_tiny_checkpoint, which any architecture's tests use)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from tiny_arch import write_tiny_checkpoint

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[kind]
    overrides.setdefault("tie_word_embeddings", kind == "qwen2")
    return write_tiny_checkpoint(config_cls, model_cls, path, seed=seed, **overrides)


@pytest.fixture(scope="session")
def tiny_model_builder():
    """`build_tiny_model` for tests that need a config of their own (a fixture, because
    `from conftest import ...` can resolve to tests/reliability/conftest.py in a full run)."""
    return build_tiny_model


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    build_tiny_model("llama", path)
    return path


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen2")
    build_tiny_model("qwen2", path, seed=1)
    return path


@pytest.fixture(scope="session")
def smollm_path():
    return builtin_model_path()


@pytest.fixture
def new_engine():
    """Make langrt.Engines (quiet, fp32 unless told) that are shut down after the test."""
    import langrt

    made = []

    def make(model_path=None, **kw):
        # float32 unless the test asks for another dtype: "auto" picks bfloat16 on CPUs with
        # AVX512-BF16, where the same test would then compare different numbers.
        settings = {"log_level": "warning", "dtype": "float32", **kw}
        engine = langrt.Engine(None if model_path is None else str(model_path), **settings)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown()


def pytest_collection_modifyitems(config, items):
    """`pytest` with no paths and no `-m` (the README's test command) leaves the slow tests out,
    so that the default run stays short on a small machine; CI runs them with `-m slow`. Named
    files or directories, or any `-m`, run exactly what they name."""
    if config.option.markexpr or config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
