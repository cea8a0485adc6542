"""Decoder-model embeddings (--is-embedding on a tiny random Qwen2) against transformers: last
token and mean pooling, batched through the scheduler; the radix cache serves repeated prefixes
for last-token pooling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import langrt

PROMPTS = [[5, 9, 33, 17, 2], [8, 8, 1, 40, 41, 42, 43, 7, 6], [3], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]]


@torch.inference_mode()
def _reference(path, prompts, mode: str) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for ids in prompts:  # one at a time: no padding to get wrong
        hidden = model.model(torch.tensor([ids])).last_hidden_state[0]  # after the final norm
        pooled = hidden[-1] if mode == "last" else hidden.mean(0)
        out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.stack(out)


@pytest.mark.parametrize("mode", ["last", "mean"])
def test_decoder_embeddings_match_transformers(tiny_qwen2_dir, mode):
    with langrt.Engine(str(tiny_qwen2_dir), is_embedding=True, pooling=mode, dtype="float32", max_total_tokens=2048,
                       context_length=256, chunked_prefill_size=8, log_level="warning") as engine:  # fmt: skip
        ours = np.array([o["embedding"] for o in engine.encode(PROMPTS)])  # the 12-token one in two chunks
        again = engine.encode(PROMPTS[3][:10] + [30, 31])  # 10 tokens shared with an earlier input
        info = engine.get_server_info()
    reference = _reference(tiny_qwen2_dir, PROMPTS + [PROMPTS[3][:10] + [30, 31]], mode)
    assert np.allclose(ours, reference[:4], atol=1e-4), np.abs(ours - reference[:4]).max()
    assert np.allclose(again["embedding"], reference[4], atol=1e-4)
    if mode == "last":
        assert again["meta_info"]["cached_tokens"] >= 8  # the radix cache served the shared prefix
    else:
        assert info["disable_radix_cache"] and again["meta_info"]["cached_tokens"] == 0
