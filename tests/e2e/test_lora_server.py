"""LoRA over HTTP: /generate's lora_path, OpenAI's model="BASE:NAME" / "NAME", run-time
/load_lora_adapter and /unload_lora_adapter, and the 400 an unknown adapter gets."""

from __future__ import annotations

import pytest
import torch

from lora_utils import merged_greedy, write_adapter
from server_utils import LaunchedServer

NEW = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_builder):
    root = tmp_path_factory.mktemp("lora_server")
    tiny_model_builder("llama", root / "base", seed=3)
    a = write_adapter(root / "base", root / "a", seed=1)
    b = write_adapter(root / "base", root / "b", seed=2, targets=["q_proj", "v_proj"])
    server = LaunchedServer("--model-path", str(root / "base"), "--dtype", "float32", "--max-total-tokens", "4096",
                            "--served-model-name", "tiny", "--lora-paths", f"a={a}")  # fmt: skip
    yield server, root / "base", a, b
    server.stop()


def ids(seed: int) -> list[int]:
    return torch.randint(17, 49152, (10,), generator=torch.Generator().manual_seed(seed)).tolist()


def generate(server, prompt, **extra):
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True},
        **extra,
    }
    return server.post("/generate", body, check=False)


def test_native_lora_path_and_base(served):
    server, base, a, _ = served
    prompt = ids(0)
    status, out = generate(server, prompt, lora_path="a")
    assert status == 200 and out["output_ids"] == merged_greedy(base, a, prompt, NEW)
    status, out = generate(server, prompt)
    assert status == 200 and out["output_ids"] == merged_greedy(base, None, prompt, NEW)


def test_unknown_adapter_is_a_400_naming_it(served):
    server = served[0]
    status, out = generate(server, ids(1), lora_path="nope")
    assert status == 400 and "unknown LoRA adapter 'nope'" in out["error"]["message"]
    status, out = server.post("/unload_lora_adapter", {"lora_name": "nope"}, check=False)
    assert status == 400 and "nope" in out["error"]["message"]
    status, out = server.post("/load_lora_adapter", {"lora_name": "bad", "lora_path": "/nonexistent"}, check=False)
    assert status == 400 and "adapter_config.json" in out["error"]["message"]


def test_openai_model_names_the_adapter(served):
    server, base, a, _ = served
    prompt = ids(2)
    text_of = lambda model: server.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": NEW,
                                                             "temperature": 0})[1]["choices"][0]["text"]  # fmt: skip
    with_a, also_a, plain = text_of("tiny:a"), text_of("a"), text_of("tiny")
    assert with_a == also_a != plain
    assert text_of("some-client-default") == plain  # a name that is no adapter: the base model
    status, out = server.post("/v1/completions", {"model": "tiny:zzz", "prompt": prompt, "max_tokens": 2}, check=False)
    assert status == 400 and "zzz" in out["error"]["message"]


def test_load_and_unload_at_run_time(served):
    server, base, _, b = served
    prompt = ids(3)
    _, reply = server.post("/load_lora_adapter", {"lora_name": "b", "lora_path": str(b)})
    assert set(reply["loaded_adapters"]) == {"a", "b"}
    status, out = generate(server, prompt, lora_path="b")
    assert status == 200 and out["output_ids"] == merged_greedy(base, b, prompt, NEW)
    _, reply = server.post("/unload_lora_adapter", {"lora_name": "b"})
    assert set(reply["loaded_adapters"]) == {"a"}
    status, out = generate(server, prompt, lora_path="b")
    assert status == 400
