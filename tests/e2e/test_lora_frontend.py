"""The DSL's adapters: gen(..., lora_path=) for one gen, run(lora_path=) for the whole program
(its gens and selects), through an in-process Engine serving two PEFT adapters."""

from __future__ import annotations

import pytest

import langrt_frontend as sgl
from lora_utils import write_adapter

GREEDY = dict(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine_and_backend(tmp_path_factory, tiny_model_builder):
    import langrt

    root = tmp_path_factory.mktemp("lora_dsl")
    tiny_model_builder("llama", root / "base", seed=3)
    a = write_adapter(root / "base", root / "a", seed=1)
    b = write_adapter(root / "base", root / "b", seed=2)
    engine = langrt.Engine(str(root / "base"), dtype="float32", max_total_tokens=4096, log_level="warning",
                           lora_paths=(f"a={a}", f"b={b}"))  # fmt: skip
    yield engine, sgl.EngineBackend(engine)
    engine.shutdown()


@sgl.function
def two_gens(s, lora_second):
    s += "The answer is"
    s += sgl.gen("first", **GREEDY)
    s += sgl.gen("second", lora_path=lora_second, **GREEDY)


@sgl.function
def pick(s):
    s += "Pick one:"
    s += sgl.select("choice", choices=[" red", " green", " blue"])


def engine_text(engine, prompt: str, lora: str | None) -> str:
    params = {"max_new_tokens": GREEDY["max_tokens"], "temperature": 0, "ignore_eos": True}
    return engine.generate(prompt, params, lora_path=lora)["text"]


def test_gen_lora_path_and_program_adapter(engine_and_backend):
    engine, backend = engine_and_backend
    state = two_gens.run(lora_second="b", backend=backend)
    prompt = "The answer is"
    assert state["first"] == engine_text(engine, prompt, None)
    assert state["second"] == engine_text(engine, prompt + state["first"], "b")
    program = two_gens.run(lora_second=None, lora_path="a", backend=backend)  # every gen under "a"
    assert program["first"] == engine_text(engine, prompt, "a") != state["first"]
    assert program["second"] == engine_text(engine, prompt + program["first"], "a")
    mixed = two_gens.run(lora_second="b", lora_path="a", backend=backend)  # the gen's own wins
    assert mixed["first"] == program["first"]
    assert mixed["second"] == engine_text(engine, prompt + mixed["first"], "b")


def test_select_scores_under_the_program_adapter(engine_and_backend):
    engine, backend = engine_and_backend
    under = {name: pick.run(lora_path=name, backend=backend).get_meta_info("choice") for name in ("a", "b")}
    base = pick.run(backend=backend).get_meta_info("choice")
    logprobs = [m["normalized_prompt_logprobs"] for m in (under["a"], under["b"], base)]
    assert logprobs[0] != logprobs[2] and logprobs[1] != logprobs[2]


def test_unknown_adapter_stops_the_program_with_its_name(engine_and_backend):
    _, backend = engine_and_backend
    state = two_gens.run(lora_second="missing", backend=backend)
    assert "unknown LoRA adapter 'missing'" in str(state.error())
