"""--model-impl: architectures langrt has no module for (GPT-NeoX, OLMo 2) served through their own
transformers code over langrt's paged attention, against transformers' own greedy decoding.

Tiny random-weight checkpoints written by transformers (float32, the built-in tokenizer borrowed
as tests/conftest.py's build_tiny_model does); the reference is a plain greedy loop over the
same checkpoint in transformers with its own (eager) attention.
"""

from __future__ import annotations

import json

import pytest
import torch

import langrt
from langrt.errors import ModelLoadError
from langrt.model.source import ModelSource

PROMPTS = [
    [1, 504, 3458, 282, 253, 1345],
    [1, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28],
    [1, 9000, 45],
]
NEW_TOKENS = 10
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=49152,
            max_position_embeddings=1024)  # fmt: skip
# Per architecture: (config and model classes, extra config, how it is served: one by naming
# transformers, one by auto (which must pick transformers for it) and with n-gram speculative
# decoding, whose greedy output must not change).
ARCHS = {
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(rotary_pct=0.25), dict(model_impl="transformers")),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(num_key_value_heads=2),
              dict(model_impl="auto", speculative_algorithm="NGRAM")),
    # Windowed and full layers (a 4-token window, which the prompts outrun) and a softmax scale
    # other than head_dim ** -0.5 (query_pre_attn_scalar).
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
                    dict(model_impl="transformers")),
}  # fmt: skip


def build_tiny(kind: str, path, seed: int = 0):
    """Save a seeded random tiny `kind` model (and the built-in tokenizer) -> the model."""
    import transformers

    from langrt.builtin import builtin_model_path
    from langrt.tokenizer.loader import load_tokenizer

    config_name, model_name, extra, _ = ARCHS[kind]
    tokenizer = load_tokenizer(builtin_model_path())
    config = getattr(transformers, config_name)(
        **{**TINY, **extra}, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():  # larger than the default init, so greedy tokens are not near-ties
        for name, param in model.named_parameters():
            param.copy_(1.0 + 0.1 * torch.randn_like(param) if "norm" in name else 0.08 * torch.randn_like(param))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def reference_greedy(model, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
    """transformers' own greedy decoding (its eager attention, the whole sequence each step)."""
    return reference_with_logprobs(model, prompt, n)[0]


def reference_with_logprobs(model, prompt: list[int], n: int = NEW_TOKENS) -> tuple[list[int], list[float]]:
    """(transformers' greedy tokens, the log-probability of each)."""
    model.config._attn_implementation = "eager"
    ids, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            ids.append(int(logits.argmax()))
            logprobs.append(torch.log_softmax(logits, dim=-1)[ids[-1]].item())
    return ids[len(prompt) :], logprobs


def greedy(n: int = NEW_TOKENS, **kw) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **kw}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def served(request, tmp_path_factory):
    """(the transformers model, a langrt Engine serving its checkpoint through transformers)."""
    kind = request.param
    path = tmp_path_factory.mktemp(kind)
    model = build_tiny(kind, path)
    with langrt.Engine(
        str(path), **ARCHS[kind][3], dtype="float32", max_total_tokens=4096, context_length=512,
        log_level="warning", grammar_compile_timeout=120.0,  # the first grammar indexes the vocabulary
    ) as engine:  # fmt: skip
        yield model, engine


def test_greedy_output_equals_transformers(served):
    model, engine = served
    for prompt in PROMPTS:
        out = engine.generate(input_ids=prompt, sampling_params=greedy(), return_logprob=True)
        tokens, logprobs = reference_with_logprobs(model, prompt)
        assert out["output_ids"] == tokens, prompt
        got = [value for value, _, _ in out["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx(logprobs, abs=1e-4)


def test_a_mixed_batch_gives_each_request_its_own_output(served):
    model, engine = served
    alone = [engine.generate(input_ids=p, sampling_params=greedy())["output_ids"] for p in PROMPTS]
    engine.flush_cache()  # the batch prefills its prompts together, none from the cache
    batch = engine.generate(input_ids=PROMPTS, sampling_params=greedy())
    assert [out["output_ids"] for out in batch] == alone == [reference_greedy(model, p) for p in PROMPTS]
    if engine.args.speculative_algorithm is not None:
        # a flush forgets earlier outputs; run again, the drafts are copied from the batch's own
        again = engine.generate(input_ids=PROMPTS, sampling_params=greedy())
        assert [out["output_ids"] for out in again] == alone
        assert sum(out["meta_info"]["spec_accepted_tokens"] for out in again) > 0, "n-gram drafts verified, some kept"


def test_a_repeated_prefix_is_reused_from_the_cache(served):
    model, engine = served
    engine.flush_cache()
    prefix = [1] + [100 + 7 * i for i in range(40)]
    first = engine.generate(input_ids=prefix + [5, 6], sampling_params=greedy())
    second = engine.generate(input_ids=prefix + [7, 8, 9], sampling_params=greedy())
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] >= len(prefix)
    assert second["output_ids"] == reference_greedy(model, prefix + [7, 8, 9])


def test_json_schema_output_is_valid_json(served):
    _, engine = served
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]}},
        "required": ["ok", "size"],
        "additionalProperties": False,
    }
    for seed in range(3):
        params = {"json_schema": json.dumps(schema), "max_new_tokens": 40, "temperature": 1.0, "seed": seed}
        out = engine.generate(input_ids=PROMPTS[0], sampling_params=params)
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        value = json.loads(out["text"])
        assert set(value) == {"ok", "size"} and isinstance(value["ok"], bool) and value["size"] in ("small", "large")


def scheduler_outputs(path, model_impl: str, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy outputs of a Scheduler in this process (no Engine processes) over the model at
    `path` run by `model_impl`'s code, the prompts' requests batched together."""
    from langrt.model.model_runner import ModelRunner
    from langrt.sampling.sampling_params import SamplingParams
    from langrt.request import Req
    from langrt.scheduler.scheduler import Scheduler
    from langrt.server_args import ServerArgs
    from langrt.tokenizer.loader import load_tokenizer
    from runner_driver import run_requests

    args = ServerArgs(model_path=str(path), model_impl=model_impl, dtype="float32", device="cpu",
                      max_total_tokens=2048, context_length=256).resolve()  # fmt: skip
    source = ModelSource.resolve(path)
    runner = ModelRunner(args, source, source.model_config(model_impl), progress=False)
    assert runner.config.impl == model_impl
    scheduler = Scheduler(runner, load_tokenizer(path), args)
    reqs = [Req(f"r{i}", list(p), SamplingParams(**greedy())) for i, p in enumerate(prompts)]
    return run_requests(scheduler, reqs)


def test_a_native_architecture_through_transformers_matches_native(tiny_llama_dir):
    expected = scheduler_outputs(tiny_llama_dir, "langrt", PROMPTS)
    assert scheduler_outputs(tiny_llama_dir, "transformers", PROMPTS) == expected


def test_auto_picks_transformers_only_where_langrt_has_no_module(tmp_path, tiny_llama_dir):
    for kind in ("gpt_neox", "olmo2"):
        build_tiny(kind, tmp_path / kind)
        assert ModelSource.resolve(tmp_path / kind).model_config("auto").impl == "transformers"
    assert ModelSource.resolve(tiny_llama_dir).model_config("auto").impl == "langrt"
    assert ModelSource.resolve(tiny_llama_dir).model_config("transformers").impl == "transformers"


def test_model_impl_langrt_on_an_architecture_without_a_module_is_refused(tmp_path, new_engine):
    build_tiny("gpt_neox", tmp_path)
    with pytest.raises(
        ModelLoadError, match=r"--model-impl langrt: .*'gpt_neox'.*GPTNeoXForCausalLM.*LlamaForCausalLM"
    ):
        new_engine(tmp_path, model_impl="langrt")


def test_an_architecture_neither_langrt_nor_transformers_has_is_named(tmp_path, new_engine):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "frobnicator", "architectures": ["FrobnicatorForCausalLM"], "hidden_size": 64})
    )
    with pytest.raises(ModelLoadError, match=r"'frobnicator' \(FrobnicatorForCausalLM\) is served neither natively"):
        new_engine(tmp_path)


def save_tiny(config_name: str, model_name: str, path, **config) -> None:
    """A tiny random model of any transformers architecture (no tokenizer: it is never served)."""
    import transformers

    getattr(transformers, model_name)(getattr(transformers, config_name)(**config)).save_pretrained(path)


def test_transformers_code_without_the_attention_interface_is_refused_at_start(tmp_path, new_engine):
    save_tiny("BloomConfig", "BloomForCausalLM", tmp_path, hidden_size=64, n_layer=2, n_head=4, vocab_size=1000)
    with pytest.raises(ModelLoadError, match="BloomForCausalLM's transformers code does not take a custom attention"):
        new_engine(tmp_path)


def test_a_head_that_scales_the_logits_is_refused(tmp_path, new_engine, capfd):
    """Granite divides its logits by logits_scaling: the load-time probe pass sees them differ,
    and the scheduler's log says so in one line."""
    from langrt.builtin import builtin_model_path
    from langrt.tokenizer.loader import load_tokenizer

    save_tiny("GraniteConfig", "GraniteForCausalLM", tmp_path, **TINY, logits_scaling=4.0)
    load_tokenizer(builtin_model_path()).save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="failed to start"):
        new_engine(tmp_path, dtype="float32", max_total_tokens=1024)
    log = capfd.readouterr().err
    assert "the model could not be loaded: granite: its causal-LM head does more than its output layer" in log
    assert "Traceback" not in log


def test_options_only_native_modules_take_are_refused(tmp_path, new_engine):
    build_tiny("gpt_neox", tmp_path)
    for options, flag in [({"quantization": "int8"}, "--quantization int8"), ({"tp_size": 2}, "--tp-size 2"),
                          ({"enable_torch_compile": True}, "--enable-torch-compile")]:  # fmt: skip
        with pytest.raises(ModelLoadError, match=f"{flag}: langrt applies it to its native modules only"):
            new_engine(tmp_path, **options)


def test_logits_of_single_tokens_are_those_of_the_full_rows(tmp_path):
    """compute_logits_of (constrained decoding's few allowed tokens) against compute_logits."""
    from langrt.model.loader import load_model

    build_tiny("gpt_neox", tmp_path)
    source = ModelSource.resolve(tmp_path)
    model = load_model(source, source.model_config(), "safetensors", torch.float32, torch.device("cpu"), progress=False)
    hidden = torch.randn(3, TINY["hidden_size"])
    rows, ids = torch.tensor([0, 2, 2, 1]), torch.tensor([5, 7, TINY["vocab_size"] - 1, 0])
    expected = model.compute_logits(hidden)[rows, ids]
    assert torch.allclose(model.compute_logits_of(hidden, rows, ids), expected, atol=1e-5)


def test_dummy_weights_are_seeded_random_values_of_the_models_shape(tmp_path):
    from langrt.model.loader import load_model

    build_tiny("gpt_neox", tmp_path)
    source = ModelSource.resolve(tmp_path)
    config = source.model_config("transformers")

    def embedding(load_format: str, seed: int = 0) -> torch.Tensor:
        model = load_model(source, config, load_format, torch.float32, torch.device("cpu"), seed=seed, progress=False)
        return model.hf_model.get_input_embeddings().weight

    stored, first, again, other = (
        embedding("safetensors"),
        embedding("dummy"),
        embedding("dummy"),
        embedding("dummy", 1),
    )
    assert first.shape == stored.shape and not torch.equal(first, stored)
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_langrt_launch_refuses_before_starting_anything(tmp_path, capsys):
    from langrt.cli import main

    build_tiny("gpt_neox", tmp_path)
    capsys.readouterr()  # the checkpoint's writing progress
    assert main(["launch", "--model-path", str(tmp_path), "--model-impl", "langrt"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("langrt: error: --model-impl langrt: langrt has no native module for model_type 'gpt_neox'")
    assert "Traceback" not in error
