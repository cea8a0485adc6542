"""`--tp-size 2` (gloo on CPU, one torch thread per rank) against one process, float32: the same
greedy outputs, and logprobs (over the whole vocabulary: the gathered logits) within rounding,
on tiny random Llama / Qwen2 models whose KV heads divide 2, do not (3: split 2 + 1), and are
fewer than the ranks (1: replicated; with int8 blocks), and on the built-in SmolLM2 (its GGUF
Q4_1 / Q8_0 blocks sharded as stored)."""

from __future__ import annotations

import pytest

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fib(n):"]
# Greedy among the tokens a grammar allows (only their logits are computed: compute_logits_of).
CONSTRAINED = ("My name is", {"max_new_tokens": 12, "temperature": 0, "regex": "[A-Z][a-z]+( [a-z]+)*\\."})


def _run(new_engine, model, tp: int, **settings) -> list[dict]:
    engine = new_engine(model, tp_size=tp, dtype="float32", num_threads=1, max_total_tokens=4096, **settings)
    if tp == 2:
        assert engine.args.tp_size == 2 and len(engine.children.tp_workers) == 1
    params = {"max_new_tokens": 16, "temperature": 0}
    outs = engine.generate(PROMPTS, params, return_logprob=True, logprob_start_len=0, top_logprobs_num=5)
    outs.append(engine.generate(CONSTRAINED[0], CONSTRAINED[1], return_logprob=True))
    engine.shutdown()
    return outs


def _assert_same(one: list[dict], two: list[dict], tol: float) -> None:
    for a, b in zip(one, two, strict=True):
        assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
        ma, mb = a["meta_info"], b["meta_info"]
        for key in ("input_token_logprobs", "output_token_logprobs"):
            assert [e[1] for e in ma[key]] == [e[1] for e in mb[key]]
            pairs = [(x[0], y[0]) for x, y in zip(ma[key], mb[key]) if x[0] is not None]
            assert max((abs(x - y) for x, y in pairs), default=0.0) < tol, key
        for key in ("input_top_logprobs", "output_top_logprobs"):
            for ta, tb in zip(ma.get(key, []), mb.get(key, []), strict=True):
                if ta is None:
                    assert tb is None
                    continue
                assert ta[0][1] == tb[0][1], "the same most likely token"
                assert max(abs(x[0] - y[0]) for x, y in zip(ta, tb)) < tol, key


@pytest.mark.parametrize(
    "kind, dims, settings, tol",
    [
        # n-gram drafts: passes of several rows per request, verified on rank 0's gathered logits
        ("llama", dict(num_attention_heads=4, num_key_value_heads=2), {"speculative_algorithm": "NGRAM"}, 1e-4),
        # every sum over gloo (no shared-memory all-reduce)
        (
            "qwen2",
            dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=96),
            {"attention_backend": "torch", "env": {"LANGRT_TP_SHM": "0"}},
            1e-4,
        ),
        # Blocks round each 32 activations to int16, so float32 rounding differences grow.
        ("llama", dict(num_attention_heads=4, num_key_value_heads=1), {"quantization": "int8"}, 1e-2),
    ],
    ids=["llama-kv2-divides-ngram", "qwen2-kv3-splits-2-1-torch-attention-gloo", "llama-kv1-replicated-int8"],
)
def test_tp2_equals_tp1_on_tiny_models(
    new_engine, tiny_model_builder, tmp_path, monkeypatch, kind, dims, settings, tol
):
    from langrt_kernels.cpu import quant

    if "quantization" in settings and not quant.available():
        pytest.skip("--quantization int8 needs the quantized CPU kernels, which are off (LANGRT_CPU_KERNELS=0)")
    for name, value in settings.pop("env", {}).items():  # the engines' processes inherit it
        monkeypatch.setenv(name, value)
    tiny_model_builder(kind, tmp_path, seed=3, **dims)
    one, two = (_run(new_engine, tmp_path, tp, **settings) for tp in (1, 2))
    _assert_same(one, two, tol)


@pytest.mark.slow
def test_tp2_equals_tp1_on_smollm2_float32(new_engine, smollm_path):
    """GGUF blocks: the activations' int16 rounding turns float32 rounding differences into
    ~1e-3 logprob differences; plain float32 weights (--quantization none) stay within 1e-4."""
    one, two = (_run(new_engine, smollm_path, tp) for tp in (1, 2))
    assert "Paris" in one[0]["text"]
    _assert_same(one, two, tol=2e-2)
    plain = [_run(new_engine, smollm_path, tp, quantization="none") for tp in (1, 2)]
    _assert_same(*plain, tol=1e-4)
