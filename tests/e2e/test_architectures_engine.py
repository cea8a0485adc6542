"""A native Gemma 3 (sliding-window layers, q/k norms, one KV head) served by a live Engine:
greedy output equal to transformers' generate, the prefix cache reused by a second request on
the same prompt, and a JSON-schema request giving valid JSON."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from tiny_arch import random_prompts, write_tiny_checkpoint

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    path = tmp_path_factory.mktemp("tiny_gemma3")
    hf = write_tiny_checkpoint(
        Gemma3TextConfig, Gemma3ForCausalLM, path, seed=7, num_hidden_layers=3, num_key_value_heads=1, head_dim=32,
        sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )  # fmt: skip
    return path, hf


@pytest.fixture(scope="module")
def engine(gemma3):
    import langrt

    with langrt.Engine(str(gemma3[0]), dtype="float32", max_total_tokens=4096, context_length=512,
                       log_level="warning") as engine:  # fmt: skip
        yield engine


def test_greedy_output_is_transformers_and_the_prefix_is_reused(gemma3, engine):
    _, hf = gemma3
    (prompt,) = random_prompts(11, (30,))
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    first = engine.generate(input_ids=prompt, sampling_params=params)
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt) :].tolist()
    assert first["output_ids"] == expected
    again = engine.generate(input_ids=prompt, sampling_params=params)
    assert again["output_ids"] == expected
    assert again["meta_info"]["cached_tokens"] >= len(prompt) - 1


def test_json_schema_request_gives_valid_json(engine):
    params = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 40, "temperature": 0}
    for out in engine.generate(["Answer as JSON:", "Status:"], params):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), SCHEMA)


def test_gemma3_tp2_equals_tp1(tmp_path, new_engine):
    """Gemma's own layer sums its o and down projections over the ranks (gloo on CPU)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    write_tiny_checkpoint(
        Gemma3TextConfig, Gemma3ForCausalLM, tmp_path, seed=9, num_hidden_layers=3, head_dim=32, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )  # fmt: skip
    prompts = random_prompts(3, (20, 9))
    params = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    outs = []
    for tp in (1, 2):
        engine = new_engine(tmp_path, tp_size=tp, dtype="float32", num_threads=1, max_total_tokens=2048)
        outs.append([out["output_ids"] for out in engine.generate(input_ids=prompts, sampling_params=params)])
        engine.shutdown()
    assert outs[0] == outs[1] and all(len(ids) == 10 for ids in outs[0])
