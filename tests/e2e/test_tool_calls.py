"""OpenAI tool calling and structural tags against `langrt launch` on the built-in model, through
the OpenAI SDK: calls whose arguments validate against their function's schema (required, a
named function, auto), streamed calls equal to whole ones, a tool result's turn, a Llama 3 style
template, and the OpenAI request fields langrt accepts, ignores or refuses."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest

from server_utils import LaunchedServer

pytestmark = pytest.mark.slow

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather forecast for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "unit", "days"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "string", "format": "email", "maxLength": 40}, "subject": {"type": "string", "maxLength": 60},
            "urgent": {"type": "boolean"}, "cc": {"type": "array", "items": {"type": "string", "format": "email", "maxLength": 40}, "maxItems": 3}},
            "required": ["to", "subject"], "additionalProperties": False}}},
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Hanoi", "Dublin"]
ASKS = [
    "What is the weather in {city} for the next {n} days?",
    "Please add {n} and {m}.",
    "Email bob@example.com that the meeting in {city} moved.",
    "Should I take an umbrella in {city} this week?",
    "What's {n} plus {m}, and is it sunny in {city}?",
]


def prompts(count: int) -> list[str]:
    return [ASKS[i % len(ASKS)].format(city=CITIES[i % len(CITIES)], n=i % 13 + 1, m=7 * i % 31) for i in range(count)]


@pytest.fixture(scope="module")
def server():
    s = LaunchedServer("--max-total-tokens", "32768")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def ask(client, prompt: str, **kw):
    kw.setdefault("max_tokens", 200)
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}], tools=TOOLS, **kw)


def valid_calls(message) -> list[tuple[str, dict]]:
    """The message's calls as (name, arguments), each checked against its function's schema."""
    calls = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name], format_checker=jsonschema.FormatChecker())
        calls.append((call.function.name, arguments))
    return calls


def test_required_and_named_calls_always_validate(client):
    """100 varied prompts, sampled at temperature 1: half with tool_choice required, half naming
    a function (rotating); parallel calls allowed for one in four."""

    def one(i: int, prompt: str):
        if i % 2:
            name = TOOLS[i // 2 % 3]["function"]["name"]
            choice = {"type": "function", "function": {"name": name}}
        else:
            name, choice = None, "required"
        # one call must fit: send_email's strings alone allow 220 characters, over 200 tokens when
        # sampled at temperature 1 (CI saw a reply of 200 tokens still inside its first call)
        r = ask(
            client, prompt, tool_choice=choice, temperature=1.0, seed=i, parallel_tool_calls=i % 4 == 2, max_tokens=400
        )
        return i, name, r.choices[0]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda a: one(*a), enumerate(prompts(100))))
    for i, name, choice in results:
        # unbounded parallel calls may run to the token limit: the complete ones are returned
        assert choice.finish_reason == "tool_calls" or (choice.finish_reason == "length" and name is None), (i, choice)
        calls = valid_calls(choice.message)
        assert calls and choice.message.content is None
        if i % 4 != 2:  # a named function, or no parallel calls: exactly one
            assert len(calls) == 1
        if name is not None:
            assert calls[0][0] == name


def test_auto_answers_in_text_or_in_valid_calls(client):
    kinds = set()
    for i, prompt in enumerate(prompts(10)):
        choice = ask(client, prompt, tool_choice="auto", temperature=1.0, seed=i, max_tokens=60).choices[0]
        if choice.message.tool_calls:
            valid_calls(choice.message)
            assert choice.finish_reason in ("tool_calls", "length")
            kinds.add("call")
        else:
            assert choice.message.content and "<tool_call>" not in choice.message.content
            kinds.add("text")
    assert kinds


def test_none_leaves_the_reply_alone(client):
    choice = ask(client, "Add 2 and 3.", tool_choice="none", temperature=0, max_tokens=20).choices[0]
    assert choice.message.tool_calls is None and choice.message.content and choice.finish_reason == "length"


@pytest.fixture(scope="module")
def float32_client():
    """A float32 server: there a greedy reply is the same bits whichever passes its tokens ride
    (with jump-forward drafts or alone); in bf16 a pass of several rows rounds differently from
    one row, and a near-tie may flip between two asks of one prompt."""
    import openai

    s = LaunchedServer("--max-total-tokens", "8192", "--dtype", "float32")
    yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused")
    assert s.stop() == 0


def test_streamed_calls_reassemble_to_the_whole_reply(float32_client):
    client = float32_client
    for prompt in prompts(5):
        whole = ask(client, prompt, tool_choice="required", temperature=0).choices[0]
        calls, reasons, content = {}, [], ""
        for chunk in ask(client, prompt, tool_choice="required", temperature=0, stream=True):
            delta = chunk.choices[0].delta
            reasons.append(chunk.choices[0].finish_reason)
            content += delta.content or ""
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = call["id"] or part.id
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
        want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
        got = [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
        assert reasons[-1] == whole.finish_reason and content == ""
        if whole.finish_reason == "length":  # the 135M model may repeat parallel calls until the
            # token limit: the stream has also sent the start of the call it cut, which the whole
            # reply leaves out
            assert want and got[: len(want)] == want and len(got) - len(want) <= 1
        else:
            assert whole.finish_reason == "tool_calls" and got == want
        assert all(c["id"].startswith("call_") for c in calls.values())


def test_a_tool_result_comes_back_for_a_second_turn(client):
    messages = [{"role": "user", "content": "What is the weather in Oslo for 3 days?"}]
    first = client.chat.completions.create(
        model="m",
        messages=messages,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
    )
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "snow", "high": -3})},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, temperature=0, max_tokens=30)
    assert second.choices[0].message.content or second.choices[0].message.tool_calls
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20  # the call and its result are in the prompt


def test_structural_tag_constrains_the_free_text(client, server):
    """Every " the" the model writes must open the tag: " the answer: <integer>." (a common word
    as the trigger, so the tiny model hits it)."""
    tag = {
        "type": "structural_tag",
        "structures": [
            {"begin": " the answer: ", "schema": {"type": "integer", "minimum": 0, "maximum": 99}, "end": "."}
        ],
        "triggers": [" the"],
    }
    prompt = [
        {
            "role": "user",
            "content": "Tell me about the history of the city of Rome and the river that runs through the city.",
        }
    ]
    text = client.chat.completions.create(model="m", messages=prompt, response_format=tag, temperature=0, max_tokens=80)
    text = text.choices[0].message.content
    native = server.post("/generate", {"text": "Tell me about the moon, the sun and the stars.", "sampling_params": {
        "structural_tag": json.dumps(tag), "max_new_tokens": 80, "temperature": 0}})[1]["text"]  # fmt: skip
    for out in (text, native):
        tags = re.findall(r" the answer: (\d+)\.", out)
        assert out.count(" the") == len(tags), out
        assert all(0 <= int(t) <= 99 for t in tags)
    assert " the answer: " in text + native  # the trigger came up


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tool_choice": "auto", "tools": None}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"logit_bias": {"50": 5}}, "logit_bias"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_bad_tool_requests_get_400_naming_the_field(server, extra, param):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **extra}
    status, payload = server.post("/v1/chat/completions", {k: v for k, v in body.items() if v is not None}, check=False)
    assert status == 400 and payload["error"]["param"] == param, payload


def test_openai_fields_that_ask_for_nothing_are_accepted(client):
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=5, user="u1", safety_identifier="s",
        prompt_cache_key="k", logit_bias={}, modalities=["text"], store=False, metadata={"a": "b"}, stop=["\n\n", "zzz"],
    )  # fmt: skip
    assert r.usage.completion_tokens <= 5


def test_n_with_logprobs_and_a_seed(client, server):
    kw = dict(model="m", messages=[{"role": "user", "content": "Name a color."}], n=3, logprobs=True, top_logprobs=2,
              temperature=1.0, seed=7, max_tokens=6)  # fmt: skip
    server.post("/flush_cache", {})  # the same passes each time (a cached prefix rounds differently in bf16)
    first = client.chat.completions.create(**kw)
    server.post("/flush_cache", {})
    again = client.chat.completions.create(**kw)
    assert (
        len(first.choices) == 3 and sum(len(c.logprobs.content) for c in first.choices) == first.usage.completion_tokens
    )
    for choice in first.choices:
        assert 0 < len(choice.logprobs.content) <= 6
        assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]


def test_a_llama3_style_template_gets_json_calls(smollm_path):
    import openai

    s = LaunchedServer("--max-total-tokens", "8192", "--chat-template", str(TEMPLATES / "llama3_tools.jinja"))
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused")
        choice = ask(client, "Add 4 and 5.", tool_choice="required", temperature=0).choices[0]
        assert choice.finish_reason == "tool_calls" and valid_calls(choice.message)
        plain = ask(client, "Add 4 and 5.", tool_choice="required", temperature=0, stream=True)
        names = [p.function.name for chunk in plain for p in chunk.choices[0].delta.tool_calls or [] if p.function.name]
        assert names == [c.function.name for c in choice.message.tool_calls]
    finally:
        assert s.stop() == 0
