"""`langrt launch --reasoning-parser qwen3` on a tiny random Qwen3 checkpoint whose tokenizer has
<think> and </think> and whose chat template thinks (tests/data/chat_templates/qwen3_think.jinja),
with each grammar backend: a JSON-schema request returns free reasoning_content and
schema-valid content, whole and streamed alike; max_reasoning_tokens forces the end of the
thinking (random weights never write </think> themselves); thinking turned off by the template
leaves the request as it is without a parser."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from server_utils import LaunchedServer

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "chat_templates" / "qwen3_think.jinja"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["answer", "n"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Is 7 a prime? Answer in JSON."}]
BUDGET = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Qwen3 whose vocabulary ends with <think> and </think> (plain added tokens,
    as Qwen3's are: they stay in the decoded text)."""
    from tokenizers import AddedToken
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from langrt.tokenizer.loader import load_tokenizer
    from tiny_arch import TINY_DIMS, write_tiny_checkpoint

    path = tmp_path_factory.mktemp("tiny_qwen3_think")
    write_tiny_checkpoint(
        Qwen3Config, Qwen3ForCausalLM, path, seed=3, head_dim=16, vocab_size=TINY_DIMS["vocab_size"] + 64
    )
    tokenizer = load_tokenizer(path)
    tokenizer.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=["langrt", "xgrammar", "llguidance"])
def server(request, model_dir):
    if request.param != "langrt":
        pytest.importorskip(request.param, reason=f"{request.param} is not installed")
    s = LaunchedServer(
        "--model-path", str(model_dir), "--chat-template", str(TEMPLATE), "--reasoning-parser", "qwen3",
        "--grammar-backend", request.param, "--dtype", "float32", "--max-total-tokens", "4096", "--num-threads", "1",
    )  # fmt: skip
    from langrt.tokenizer.loader import load_tokenizer

    s.tokenizer = load_tokenizer(model_dir)
    yield s
    assert s.stop() == 0


def chat(server, **fields) -> dict:
    body = {"model": "m", "messages": MESSAGES, "temperature": 0, "max_tokens": 64, "response_format": FORMAT, **fields}
    return server.post("/v1/chat/completions", body)[1]


def streamed(server, **fields) -> tuple[str, str, str | None]:
    """(reasoning_content, content, finish_reason) joined from a stream's deltas."""
    body = {
        "model": "m",
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 64,
        "response_format": FORMAT,
        "stream": True,
        **fields,
    }
    reasoning, content, reason = [], [], None
    for chunk in server.stream("/v1/chat/completions", body):
        if chunk == "[DONE]":
            break
        choice = chunk["choices"][0]
        reasoning.append(choice["delta"].get("reasoning_content") or "")
        content.append(choice["delta"].get("content") or "")
        reason = choice["finish_reason"] or reason
    return "".join(reasoning), "".join(content), reason


def test_free_thinking_then_schema_valid_answer(server):
    out = chat(server, max_reasoning_tokens=BUDGET)
    message = out["choices"][0]["message"]
    assert isinstance(message["reasoning_content"], str) and message["reasoning_content"], message
    assert "<think>" not in message["content"] and "</think>" not in message["content"]
    jsonschema.validate(json.loads(message["content"]), SCHEMA)
    assert out["choices"][0]["finish_reason"] == "stop"


def test_streamed_equals_whole(server):
    whole = chat(server, max_reasoning_tokens=BUDGET)["choices"][0]
    reasoning, content, reason = streamed(server, max_reasoning_tokens=BUDGET)
    assert (reasoning, content, reason) == (
        whole["message"]["reasoning_content"],
        whole["message"]["content"],
        whole["finish_reason"],
    )
    buffered = streamed(server, max_reasoning_tokens=BUDGET, stream_reasoning=False)
    assert buffered == (reasoning, content, reason)


def test_budget_forces_the_end_token(server):
    """On /generate (sampling_params.reasoning): exactly BUDGET thinking tokens, then </think>,
    then the grammar's answer."""
    end = server.tokenizer.convert_tokens_to_ids("</think>")
    prompt = server.tokenizer.apply_chat_template(
        MESSAGES, chat_template=TEMPLATE.read_text(), tokenize=False, add_generation_prompt=True
    )
    params = {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA), "reasoning": True}
    for budget in (0, BUDGET):
        out = server.post("/generate", {"text": prompt, "sampling_params": {**params, "max_reasoning_tokens": budget}})[
            1
        ]
        assert out["output_ids"].index(end) == budget
        jsonschema.validate(json.loads(out["text"].split("</think>", 1)[1]), SCHEMA)


def test_separate_reasoning_off_keeps_thinking_in_content(server):
    whole = chat(server, max_reasoning_tokens=BUDGET)["choices"][0]["message"]
    joined = chat(server, max_reasoning_tokens=BUDGET, separate_reasoning=False)["choices"][0]["message"]
    assert "reasoning_content" not in joined
    thinking, answer = joined["content"].split("</think>", 1)
    assert thinking.strip() == whole["reasoning_content"] and answer.strip() == whole["content"]


def test_thinking_off_is_an_ordinary_request(server):
    """enable_thinking false: the template closes the thinking in the prompt, the schema holds
    from the first token, and the output is /generate's for that prompt with no reasoning."""
    kwargs = {"enable_thinking": False}
    message = chat(server, chat_template_kwargs=kwargs)["choices"][0]["message"]
    assert message["reasoning_content"] is None
    jsonschema.validate(json.loads(message["content"]), SCHEMA)
    prompt = server.tokenizer.apply_chat_template(
        MESSAGES, chat_template=TEMPLATE.read_text(), tokenize=False, add_generation_prompt=True, **kwargs
    )
    params = {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA)}
    assert server.post("/generate", {"text": prompt, "sampling_params": params})[1]["text"] == message["content"]


def test_bad_reasoning_fields_are_400(server):
    for fields, param in (
        ({"max_reasoning_tokens": -1}, "max_reasoning_tokens"),
        ({"separate_reasoning": "yes"}, "separate_reasoning"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"enable_thinking": False}, "max_reasoning_tokens": 4}, "max_reasoning_tokens"),
    ):
        status, body = server.post("/v1/chat/completions", {"messages": MESSAGES, **fields}, check=False)
        assert status == 400 and body["error"]["param"] == param, (fields, body)


def test_tool_call_after_thinking(server):
    """A named tool choice: the call's grammar starts after </think>; the call's arguments
    validate against the function's schema and the thinking is reasoning_content."""
    parameters = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "is_prime", "parameters": parameters}}]
    body = {"model": "m", "messages": MESSAGES, "temperature": 0, "max_tokens": 64, "max_reasoning_tokens": BUDGET,
            "tools": tools, "tool_choice": {"type": "function", "function": {"name": "is_prime"}}}  # fmt: skip
    choice = server.post("/v1/chat/completions", body)[1]["choices"][0]
    message = choice["message"]
    assert message["reasoning_content"] and choice["finish_reason"] == "tool_calls", choice
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "is_prime"
    jsonschema.validate(json.loads(call["function"]["arguments"]), parameters)


def test_frontend_gen_with_reasoning(server):
    """`gen(reasoning=True)` through RuntimeEndpoint: the answer (schema-valid) and the thinking
    in two variables, the program's text holding both."""
    import langrt_frontend as sgl

    prompt = server.tokenizer.apply_chat_template(
        MESSAGES, chat_template=TEMPLATE.read_text(), tokenize=False, add_generation_prompt=True
    )

    @sgl.function
    def ask(s):
        s += prompt + sgl.gen(
            "out", reasoning=True, max_reasoning_tokens=BUDGET, json_schema=SCHEMA, max_tokens=64, temperature=0
        )

    state = ask.run(backend=sgl.RuntimeEndpoint(server.url))
    jsonschema.validate(json.loads(state["out"]), SCHEMA)
    assert state["out_reasoning"] and state.text().startswith(prompt) and state.text().endswith(state["out"])
    assert "</think>" in state.text()
