"""`langrt launch` on the built-in model: the OpenAI SDK and the native API end to end, on one
process and on two tensor-parallel ranks (`--tp-size 2`)."""

from __future__ import annotations

import pytest

from server_utils import LaunchedServer

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def server(request):
    """Every test runs on one process and on two tensor-parallel ranks (one torch thread each,
    so the two share this machine's cores instead of fighting over them)."""
    tp = request.param
    s = LaunchedServer("--max-total-tokens", "32768", *(["--tp-size", "2", "--num-threads", "1"] if tp == 2 else []))
    if tp == 2:
        _, info = s.get("/get_server_info")
        assert info["tp_size"] == 2 and len(info["processes"]["tp_workers"]) == 1
    yield s
    assert s.stop() == 0, "SIGTERM ends the server cleanly"


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


# ---- OpenAI SDK ---------------------------------------------------------------------------------


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct"]


def test_chat_completion(client):
    out = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=24, temperature=0)
    choice = out.choices[0]
    assert "Paris" in choice.message.content and choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert out.object == "chat.completion"
    u = out.usage
    assert u.prompt_tokens > 10 and u.completion_tokens >= 5 and u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_completion(client):
    out = client.completions.create(model="any", prompt="The capital of France is", max_tokens=6, temperature=0)
    assert out.object == "text_completion"
    assert "Paris" in out.choices[0].text and out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 6 and out.usage.prompt_tokens == 5


def test_streaming_chat_deltas_equal_the_whole(client):
    whole = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=24, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="any",
            messages=QUESTION,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_n_samples(client):
    one = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=8, temperature=0)
    out = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=8, temperature=0.9, n=2, seed=1)
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.message.content for c in out.choices)
    assert out.usage.prompt_tokens == one.usage.prompt_tokens, "the prompt is counted once"
    assert 2 <= out.usage.completion_tokens <= 16


def test_stop_strings(client):
    out = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=24, temperature=0, stop=["Paris"])
    assert "Paris" not in out.choices[0].message.content
    assert out.choices[0].message.content.startswith("The capital of France is")
    assert out.choices[0].finish_reason == "stop"


def test_completion_logprobs_and_echo(client):
    out = client.completions.create(
        model="any", prompt="The capital of France is", max_tokens=3, temperature=0, logprobs=2, echo=True
    )
    lp = out.choices[0].logprobs
    assert out.choices[0].text.startswith("The capital of France is")
    assert len(lp.tokens) == 5 + 3 and lp.token_logprobs[0] is None
    assert all(len(t) == 2 for t in lp.top_logprobs[1:])


def test_chat_logprobs(client):
    out = client.chat.completions.create(
        model="any", messages=QUESTION, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    for item in content:
        assert item.top_logprobs[0].token == item.token and len(item.top_logprobs) == 3


# ---- native API ---------------------------------------------------------------------------------

META_FIELDS = {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "e2e_latency"}


def test_native_batch_of_texts(server):
    _, outs = server.post(
        "/generate",
        {
            "text": ["The capital of France is", "1, 2, 3,"],
            "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            "rid": ["a", "b"],
        },
    )
    assert [o["meta_info"]["id"] for o in outs] == ["a", "b"]
    for o in outs:
        assert set(o) == {"text", "output_ids", "meta_info"} and set(o["meta_info"]) == META_FIELDS
        assert o["meta_info"]["completion_tokens"] == len(o["output_ids"]) == 4
        assert o["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert "Paris" in outs[0]["text"]


def test_native_input_ids_match_text(server):
    _, by_text = server.post(
        "/generate", {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    )
    _, info = server.get("/get_model_info")
    assert info["is_generation"] and info["context_length"] == 8192 and info["vocab_size"] == 49152
    ids = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    _, by_ids = server.post("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert by_ids["output_ids"] == by_text["output_ids"]


def test_native_streaming_is_cumulative(server):
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
    _, whole = server.post("/generate", body)
    events = server.stream("/generate", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    texts = [e["text"] for e in events[:-1]]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), "each event extends the previous"
    assert (
        texts[-1] == whole["text"] and events[-2]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    )


def test_native_input_logprobs_from_a_start(server):
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 2, "top_logprobs_num": 2, "return_text_in_logprobs": True}  # fmt: skip
    _, out = server.post("/generate", body)
    meta = out["meta_info"]
    assert [e[1] for e in meta["input_token_logprobs"]] == [282, 4649, 314]
    assert [e[2] for e in meta["input_token_logprobs"]] == [" of", " France", " is"]
    assert len(meta["output_token_logprobs"]) == 2 and len(meta["output_top_logprobs"]) == 2
    assert all(len(top) == 2 for top in meta["input_top_logprobs"])


def test_native_prefill_only(server):
    body = {
        "text": "The capital of France is",
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    _, out = server.post("/generate", body)
    assert out["text"] == "" and out["output_ids"] == []
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert out["meta_info"]["input_token_logprobs"][0][0] is None and len(out["meta_info"]["input_token_logprobs"]) == 5


def test_server_info_and_flush(server):
    _, info = server.get("/get_server_info")
    for key in (
        "model_path",
        "version",
        "kv_total_tokens",
        "kv_available_tokens",
        "kv_cached_tokens",
        "running_requests",
        "waiting_requests",
        "cache_hit_rate",
    ):
        assert key in info
    assert info["kv_total_tokens"] == 32768
    assert server.post("/flush_cache", {"empty_cache": True})[0] == 200
    _, out = server.post("/generate", {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 1}})
    assert out["meta_info"]["cached_tokens"] == 0
    _, again = server.post("/generate", {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 1}})
    assert again["meta_info"]["cached_tokens"] == 4


def test_metrics(server):
    status, text = server.get("/metrics")
    assert status == 200
    for name in ("langrt_requests_total", "langrt_prompt_tokens_total", "langrt_generation_tokens_total",
                 "langrt_time_to_first_token_seconds_bucket", "langrt_time_per_output_token_seconds_count",
                 "langrt_running_requests", "langrt_waiting_requests", "langrt_cache_hit_rate", "langrt_kv_usage"):  # fmt: skip
        assert name in text, name
