"""The frontend's OpenAI backend (`sgl.OpenAI`) against two kinds of OpenAI-compatible server on
the built-in SmolLM2-135M-Instruct: langrt's own /v1 (the session's frontend server, shared
with test_frontend_server.py) and llama-cpp-python's server (its tests skip, naming what is
missing, where llama-cpp-python or its server extras are not installed).

The programs of examples/ run unchanged on both; their outputs are held to what cannot be
wrong (regexes match, JSON validates against the schema, a select picks one of its choices,
role blocks become the messages), and on langrt to the native backend's own results."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest

import langrt_frontend as sgl
from langrt.builtin import builtin_model_path
from server_utils import free_port

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LLAMA_SERVER_MODULES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def langrt_server(frontend_server):
    return frontend_server


@pytest.fixture(scope="module")
def llama_server():
    """llama-cpp-python's OpenAI server on the built-in model's GGUF file."""
    missing = [m for m in LLAMA_SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"llama.cpp's OpenAI server needs {', '.join(missing)} (pip install 'llama-cpp-python[server]')")
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(builtin_model_path()), "--port", str(port),
               "--n_ctx", "4096", "--n_threads", "1", "--verbose", "False"]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url + "/v1/models", process, log)
        yield url
    finally:
        process.terminate()
        process.wait(20)


def _wait_for(url: str, process, log, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"llama_cpp.server exited with {process.returncode}:\n{log.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")


@pytest.fixture(params=["langrt", "llama.cpp"], scope="module")
def server_url(request, langrt_server):
    # langrt_server is asked for in both cases: the conftest stops it after its last user,
    # which it finds among the fixtures a test names.
    return langrt_server.url if request.param == "langrt" else request.getfixturevalue("llama_server")


def openai(url: str, **kw) -> sgl.OpenAI:
    return sgl.OpenAI("smollm2", base_url=url + "/v1", **kw)


# ---- the examples, on both servers -------------------------------------------------------------


def test_the_server_kind_is_detected(server_url, request):
    backend = openai(server_url)
    expected = {"langrt": ("regex", "langrt or SGLang"), "llama.cpp": ("gbnf", "llama.cpp")}[
        request.node.callspec.params["server_url"]
    ]
    assert (backend.constraints.name, backend.server_kind) == expected


def test_quickstart_program(server_url):
    quickstart = example("quickstart")
    state = quickstart.travel_guide.run(city="Paris", max_tokens=12, temperature=0, backend=openai(server_url))
    assert state.error() is None
    assert "France" in state["country"]
    assert state["river"] in ("The Seine", "The Thames", "The Danube")
    assert len(state["sight"]) == 2 and all(isinstance(s, str) and s.strip() for s in state["sight"])
    messages = state.messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == state["country"].lstrip() and messages[3]["content"] == state["river"]


def test_json_extraction_program(server_url):
    json_extraction = example("json_extraction")
    documents = json_extraction.DOCUMENTS[:2]
    states = json_extraction.extract.run_batch(
        [{"document": d, "max_tokens": 64} for d in documents], temperature=0, backend=openai(server_url)
    )
    for document, state in zip(documents, states):
        assert state.error() is None
        record = json.loads(state["record"])
        jsonschema.validate(record, json_extraction.SCHEMA)
        assert record["name"].split()[0] in document


def test_fork_and_vote_program(server_url):
    fork_and_vote = example("fork_and_vote")
    state = fork_and_vote.fork_and_vote.run(
        question=fork_and_vote.QUESTION, n=3, max_tokens=6, backend=openai(server_url)
    )
    assert state.error() is None
    candidates = state.ret_value
    assert len(candidates) == 3 and state["best"] in candidates
    assert state.messages()[-1] == {"role": "assistant", "content": "The correct answer is " + state["best"]}


def test_streaming_chat_program_streams_what_a_plain_run_returns(server_url):
    chat_turn = example("streaming_chat").chat_turn
    backend = openai(server_url)
    args = dict(history=[("Hi!", "Hello! How can I help?")], message="Name a colour.", max_tokens=16, temperature=0)
    streamed = chat_turn.run(**args, stream=True, backend=backend)
    pieces = list(streamed.text_iter("reply"))
    assert streamed.error() is None and pieces and "".join(pieces) == streamed["reply"]
    assert streamed.get_meta_info("reply")["finish_reason"]["type"] in ("stop", "length")
    assert streamed["reply"] == chat_turn.run(**args, backend=backend)["reply"]
    assert [m["role"] for m in streamed.messages()] == ["user", "assistant", "user", "assistant"]


def test_few_shot_classification_program(server_url):
    classify = example("few_shot_classification").classify
    error = classify.run(review="Charming and funny.", backend=openai(server_url)).error()
    assert (
        isinstance(error, sgl.UnsupportedPrimitive)
        and "select" in str(error)
        and "outside any role block" in str(error)
    )
    state = classify.run(review="Charming and funny.", backend=openai(server_url, is_chat_model=False))
    assert state.error() is None and state["label"] in ("positive", "negative")


def test_regex_and_dtype(server_url):
    @sgl.function
    def profile(s):
        s += sgl.user("Write a phone number.")
        s += sgl.assistant(sgl.gen("phone", regex=r"[0-9]{3}-[0-9]{4}", max_tokens=16))
        s += sgl.user("How old is the caller?")
        s += sgl.assistant("The caller is " + sgl.gen_int("age", max_tokens=6) + " years old.")

    state = profile.run(temperature=0, backend=openai(server_url))
    assert state.error() is None
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", state["phone"])
    assert re.fullmatch(r"[-+]?[0-9]+", state["age"])
    assert state.messages()[-1]["content"] == f"The caller is {state['age']} years old."


def test_output_logprobs(server_url):
    @sgl.function
    def hello(s):
        s += sgl.user("Hi") + sgl.assistant(sgl.gen("x", max_tokens=3, return_logprob=True, top_logprobs_num=2))

    state = hello.run(temperature=0, backend=openai(server_url))
    meta = state.get_meta_info("x")
    assert state.error() is None and len(meta["output_token_logprobs"]) == meta["completion_tokens"] == 3
    assert "".join(text for _, _, text in meta["output_token_logprobs"]) == state["x"]
    for (value, _, token), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert value <= 0 and len(top) == 2 and top[0][0] >= top[1][0], "greedy: the top entry first"
        assert top[0][2] == token


# ---- langrt: the same results as the native backend --------------------------------------------


def test_chat_messages_match_the_native_backend(langrt_server):
    analyze = example("multi_step_analysis").analyze
    args = dict(topic="Why do cities plant trees?", step_tokens=12, temperature=0)
    native = analyze.run(**args, backend=sgl.RuntimeEndpoint(langrt_server.url))
    over_openai = analyze.run(**args, backend=openai(langrt_server.url))
    assert over_openai.error() is None and native.error() is None
    assert over_openai.messages() == native.messages(), "the server's chat template renders what the native text holds"
    assert over_openai.get_meta_info("summary")["completion_tokens"] <= 12


def test_completion_model_matches_the_native_backend(langrt_server):
    """A completion model sends the program's text (the server's own template, ChatML)."""
    few_shot = example("few_shot_classification")
    reviews = [{"review": r} for r, _ in few_shot.REVIEWS[:2]]
    backend = openai(langrt_server.url, is_chat_model=False)
    assert backend.chat_template.name == "chatml"
    native = few_shot.classify.run_batch(reviews, backend=sgl.RuntimeEndpoint(langrt_server.url))
    over_openai = few_shot.classify.run_batch(reviews, backend=backend)
    for a, b in zip(native, over_openai):
        assert b.error() is None and a["label"] == b["label"]
        assert b.get_meta_info("label")["normalized_prompt_logprobs"] == pytest.approx(
            a.get_meta_info("label")["normalized_prompt_logprobs"], abs=0.05
        )
    quickstart = example("quickstart")
    native_state = quickstart.travel_guide.run(
        city="Rome", max_tokens=10, temperature=0, backend=sgl.RuntimeEndpoint(langrt_server.url)
    )
    state = quickstart.travel_guide.run(city="Rome", max_tokens=10, temperature=0, backend=backend)
    assert (
        state.error() is None
        and state["country"] == native_state["country"]
        and state["river"] == native_state["river"]
    )


def test_langrt_samples_n_and_refuses_a_grammar_field(langrt_server):
    @sgl.function
    def answer(s, **kw):
        s += sgl.user("Say a word.") + sgl.assistant(sgl.gen("w", max_tokens=4, **kw))

    state = answer.run(n=2, backend=openai(langrt_server.url))
    assert state.error() is None and isinstance(state["w"], list) and len(state["w"]) == 2
    error = answer.run(regex="[a-z]+", backend=openai(langrt_server.url, constraints="gbnf")).error()
    assert "gen(regex)" in str(error) and langrt_server.url in str(error) and "grammar" in str(error)


# ---- llama.cpp: what it lacks is named ---------------------------------------------------------


def test_llama_cpp_gaps_are_named(llama_server):
    @sgl.function
    def answer(s, **kw):
        s += sgl.user("Say hello.") + sgl.assistant(sgl.gen("w", **kw))

    backend = openai(llama_server)
    error = answer.run(n=2, max_tokens=4, backend=backend).error()
    assert isinstance(error, sgl.UnsupportedPrimitive) and "gen(n=2)" in str(error) and llama_server in str(error)
    completion = openai(llama_server, is_chat_model=False)
    error = answer.run(json_schema={"type": "object"}, backend=completion).error()
    assert isinstance(error, sgl.UnsupportedPrimitive) and "gen(json_schema)" in str(error)
    # llama-cpp-python ignores a `regex` field it does not know: the output check catches it.
    error = answer.run(regex=r"[0-9]{3}-[0-9]{4}", stop=["\n", "."], max_tokens=48, temperature=0,
                       backend=openai(llama_server, constraints="regex")).error()  # fmt: skip
    assert "gen(regex)" in str(error) and "does not match" in str(error)
