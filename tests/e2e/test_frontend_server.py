"""The frontend against a live `langrt launch` on the built-in SmolLM2-135M-Instruct: every
primitive end to end, concurrency and prefix sharing in the runtime, errors, SGLang's own
documentation programs, and the examples. Content is asserted only where a 135M model is
reliable (greedy answers to trivial questions); structure always."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import langrt_frontend as sgl
from server_utils import free_port

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def server(frontend_server):
    return frontend_server  # conftest.py: one server for this module and the OpenAI backend's


@pytest.fixture(scope="module")
def backend(server):
    return sgl.RuntimeEndpoint(server.url)


@pytest.fixture
def counted(server):
    """A fresh endpoint that counts its /generate calls."""
    endpoint = sgl.RuntimeEndpoint(server.url)
    calls = []
    send = endpoint.generate

    def generate(payload):
        calls.append(payload)
        return send(payload)

    endpoint.generate = generate
    endpoint.calls = calls
    return endpoint


def forward_passes(backend) -> int:
    return sgl.get_server_info(backend)["forward_passes"]


# ---- primitives -------------------------------------------------------------------------------


def test_chat_template_comes_from_the_model(backend):
    assert backend.chat_template == sgl.get_chat_template("chatml")


def test_gen_in_roles_answers_and_records_messages(backend):
    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=16))

    state = qa.run(question="What is the capital of France?", temperature=0, backend=backend)
    assert "Paris" in state["answer"]
    assert [m["role"] for m in state.messages()] == ["user", "assistant"]
    assert state.text().startswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert state.messages()[-1]["content"] == state["answer"].lstrip()
    assert state.text().endswith(state["answer"] + "<|im_end|>\n")
    meta = state.get_meta_info("answer")
    assert meta["prompt_tokens"] > 0 and 0 < meta["completion_tokens"] <= 16
    assert meta["finish_reason"]["type"] in ("stop", "length")


@pytest.mark.parametrize(
    "method", [sgl.token_length_normalized, sgl.greedy_token_selection, sgl.unconditional_likelihood_normalized]
)
def test_select_is_one_scoring_request_with_every_choice(counted, method):
    @sgl.function
    def capital(s):
        s += sgl.user("What is the capital of France?")
        s += sgl.assistant(
            "The capital of France is "
            + sgl.select("city", choices=["Paris", "London", "Berlin"], choices_method=method)
        )

    state = capital.run(backend=counted)
    assert state.error() is None and state["city"] in ("Paris", "London", "Berlin")
    # The prompt's ~90 characters are cached first (one request), then one request scores every
    # choice from the end of the prompt.
    cache, score = counted.calls
    assert cache == {"text": score["text"][0], "sampling_params": {"max_new_tokens": 0}}
    assert score["sampling_params"] == {"max_new_tokens": 0} and score["return_logprob"] is True
    assert len(score["text"]) == (7 if method is sgl.unconditional_likelihood_normalized else 4)
    meta = state.get_meta_info("city")
    assert len(meta["normalized_prompt_logprobs"]) == 3 and len(meta["input_token_logprobs"]) == 3
    assert all(len(tokens) >= 1 for tokens in meta["input_token_logprobs"])
    assert all(out == [] for out in meta["output_token_logprobs"])
    if method is sgl.token_length_normalized:
        assert state["city"] == "Paris"


def test_gen_with_choices_is_a_select(counted):
    @sgl.function
    def f(s):
        s += "Q: Is fire hot? Answer yes or no.\nA: " + sgl.gen("yn", choices=["yes", "no"])

    state = f.run(backend=counted)
    assert state["yn"] in ("yes", "no") and [
        len(c["text"]) if c.get("return_logprob") else 0 for c in counted.calls
    ] == [0, 3]


def test_constrained_gens(backend):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }

    @sgl.function
    def f(s):
        s += sgl.user("Describe a person as JSON.") + sgl.assistant(
            sgl.gen("person", max_tokens=40, json_schema=schema)
        )
        s += "\nTwo plus two is " + sgl.gen_int("sum", max_tokens=4)
        s += "\nPi is roughly " + sgl.gen("pi", dtype=float, max_tokens=8)
        s += "\nIs water wet? " + sgl.gen("wet", dtype=bool)
        s += "\nIP: " + sgl.gen("ip", max_tokens=16, regex=r"(\d{1,3}\.){3}\d{1,3}")

    state = f.run(temperature=0, backend=backend)
    assert state.error() is None
    person = json.loads(state["person"])
    assert set(person) == {"name", "age"} and isinstance(person["age"], int) and len(person["name"]) <= 12
    assert re.fullmatch(r"[-+]?[0-9]+", state["sum"])
    assert re.fullmatch(r"[-+]?[0-9]*\.?[0-9]+", state["pi"])
    assert state["wet"] in ("True", "False")
    assert re.fullmatch(r"(\d{1,3}\.){3}\d{1,3}", state["ip"])


def test_gen_with_an_ebnf_grammar(backend):
    grammar = 'root ::= "The answer is " num "."\nnum ::= [1-9] [0-9]? | "(" num ")"'

    @sgl.function
    def f(s):
        s += sgl.user("What is 17 + 25?") + sgl.assistant(sgl.gen("answer", max_tokens=16, ebnf=grammar))

    state = f.run(temperature=0, backend=backend)
    assert state.error() is None
    assert re.fullmatch(r"The answer is (\(*)[1-9][0-9]?(\)*)\.", state["answer"]), state["answer"]


def test_ebnf_over_http_and_a_bad_grammar_is_a_400_naming_the_position(server):
    body = {
        "text": "Count: ",
        "sampling_params": {
            "ebnf": 'root ::= [1-9] [0-9]? (", " [1-9] [0-9]?){2}',
            "max_new_tokens": 30,
            "temperature": 0,
        },
    }
    status, out = server.post("/generate", body)
    assert status == 200 and re.fullmatch(r"[1-9][0-9]?(, [1-9][0-9]?){2}", out["text"]), out
    body["sampling_params"]["ebnf"] = 'root ::= "a"\nitem ::= item "b"'
    status, out = server.post("/generate", body, check=False)
    assert (
        status == 400 and "line 2, column 1" in out["error"]["message"] and "left recursion" in out["error"]["message"]
    )


def test_json_schema_options_over_http(server):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
    params = {
        "json_schema": json.dumps(schema),
        "json_schema_options": {"any_order": True},
        "max_new_tokens": 40,
        "temperature": 0,
    }
    status, out = server.post("/generate", {"text": "A person as JSON: ", "sampling_params": params})
    assert status == 200 and set(json.loads(out["text"])) == {"name", "age"}, out
    params["json_schema_options"] = {"sorted_keys": True}
    status, out = server.post("/generate", {"text": "A person as JSON: ", "sampling_params": params}, check=False)
    assert (
        status == 400 and out["error"]["param"] == "json_schema_options" and "any_order" in out["error"]["message"]
    ), out


def test_stop_n_and_logprobs(backend):
    @sgl.function
    def f(s):
        s += "Count: one, two, three," + sgl.gen("rest", max_tokens=12, stop=",")
        s += "\nColours:" + sgl.gen("samples", n=2, max_tokens=4, temperature=0.8)
        s += "\nThe" + sgl.gen("lp", max_tokens=3, return_logprob=True, top_logprobs_num=2)

    state = f.run(temperature=0, backend=backend)
    assert "," not in state["rest"] and state.get_meta_info("rest")["finish_reason"]["type"] == "stop"
    assert isinstance(state["samples"], list) and len(state["samples"]) == 2
    assert f"Colours:{state['samples'][0]}\n" in state.text()
    meta = state.get_meta_info("lp")
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_streaming_text_iter(backend):
    @sgl.function
    def f(s):
        s += sgl.user("Write a sentence about the sea.") + sgl.assistant(
            sgl.gen("line", max_tokens=10, ignore_eos=True)
        )

    state = f.run(stream=True, temperature=0, backend=backend)
    pieces = list(state.text_iter("line"))
    assert len(pieces) > 1 and "".join(pieces) == state["line"]
    whole = f.run(stream=True, temperature=0, backend=backend)
    assert "".join(whole.text_iter()) == whole.text()


def test_var_scope_copy_and_concatenating_join(backend):
    @sgl.function
    def f(s):
        s += "A list of fruits:"
        with s.var_scope("first"):
            s += " apple," + sgl.gen(max_tokens=3)
        forks = s.fork(2)
        forks += [" banana,", " cherry,"]
        forks += sgl.gen("more", max_tokens=3)
        forks.join("concate_and_append")

    state = f.run(temperature=0, backend=backend)
    assert state.error() is None and state["first"].startswith(" apple,")
    assert state.text().index(" banana,") < state.text().index(" cherry,")


# ---- concurrency and prefix sharing in the runtime ------------------------------------------------


def test_forks_run_as_one_batch_and_share_the_prefix(backend):
    n, tokens = 4, 8

    @sgl.function
    def f(s):
        s += sgl.user("Name an animal that lives in the ocean.") + sgl.assistant_begin()
        forks = s.fork(n)
        forks += sgl.gen("animal", max_tokens=tokens, ignore_eos=True, temperature=0.8)
        forks.join()

    before = forward_passes(backend)
    state = f.run(backend=backend)
    passes = forward_passes(backend) - before
    assert len(state["animal"]) == n
    # One after another, n forks need at least n * tokens passes; batched together about tokens.
    assert passes < n * tokens * 3 // 4, f"{passes} forward passes: the forks did not decode as one batch"
    assert all(meta["cached_tokens"] > 0 for meta in state.get_meta_info("animal"))


def test_run_batch_items_run_as_one_batch_and_share_the_prefix(backend):
    n, tokens = 4, 8

    @sgl.function
    def f(s, topic):
        s += sgl.system("You write one short line about the topic you are given, in plain words.")
        s += sgl.user(topic) + sgl.assistant(sgl.gen("line", max_tokens=tokens, ignore_eos=True))

    before = forward_passes(backend)
    topics = ["rain", "bread", "music", "stars"]
    states = f.run_batch([{"topic": t} for t in topics], backend=backend)
    passes = forward_passes(backend) - before
    assert [s.messages()[1]["content"] for s in states] == topics, "states come back in input order"
    assert passes < n * tokens * 3 // 4, f"{passes} forward passes: the items did not decode as one batch"
    assert all(s.get_meta_info("line")["cached_tokens"] > 0 for s in states)


# ---- errors -------------------------------------------------------------------------------------


def test_server_rejection_is_recorded_on_the_state(backend):
    @sgl.function
    def f(s):
        s += "Hello" + sgl.gen("a", max_tokens=-1) + sgl.gen("b", max_tokens=2)

    state = f.run(backend=backend)
    error = state.error()
    assert isinstance(error, RuntimeError) and "400" in str(error) and "max_new_tokens" in str(error)
    with pytest.raises(KeyError):
        state["a"]
    with pytest.raises(KeyError):
        state["b"]


def test_clear_errors(backend, tmp_path):
    @sgl.function
    def f(s):
        s += "Hi" + sgl.gen("a", max_tokens=1)

    with pytest.raises(KeyError, match="no variable 'missing'"):
        f.run(backend=backend)["missing"]

    @sgl.function
    def raises(s):
        s += "Hi"
        raise RuntimeError("the program body failed")

    with pytest.raises(RuntimeError, match="the program body failed"):
        raises.run(backend=backend)

    @sgl.function
    def hot_select(s):
        s += "Pick: " + sgl.select("x", choices=["a", "b"], temperature=0.7)

    error = hot_select.run(backend=backend).error()
    assert isinstance(error, ValueError) and "temperature must be 0" in str(error)

    picture = tmp_path / "pixel.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n")

    @sgl.function
    def looks(s):
        s += sgl.user(sgl.image(str(picture)) + "What is in the picture?") + sgl.assistant(sgl.gen("a", max_tokens=4))

    error = looks.run(backend=backend).error()
    assert isinstance(error, RuntimeError) and "text-only" in str(error)

    with pytest.raises(RuntimeError, match="cannot reach"):
        sgl.RuntimeEndpoint(f"http://127.0.0.1:{free_port()}")


def test_flush_cache_and_server_info(backend):
    info = sgl.get_server_info(backend)
    assert info["version"] and info["running_requests"] == 0 and "kv_total_tokens" in info
    assert sgl.flush_cache(backend) is True
    sgl.set_default_backend(backend)
    try:
        assert sgl.flush_cache() is True and sgl.get_server_info()["model_path"] == info["model_path"]
    finally:
        sgl.set_default_backend(None)


# ---- SGLang's documentation programs, with only the import changed ------------------------------


@sgl.function
def few_shot_qa(s, question):
    s += """The following are questions with answers.
Q: What is the capital of France?
A: Paris
Q: What is the capital of Germany?
A: Berlin
Q: What is the capital of Italy?
A: Rome
"""
    s += "Q: " + question + "\n"
    s += "A:" + sgl.gen("answer", stop="\n", temperature=0)


@sgl.function
def multi_turn_question(s, question_1, question_2):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=24))
    s += sgl.user(question_2)
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=24))


@sgl.function
def tip_suggestion(s):
    s += "Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular Exercise.\n\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Now, expand tip {i + 1} into a paragraph:\n"
        f += sgl.gen("detailed_tip", max_tokens=16, stop="\n\n")
    s += "Tip 1:" + forks[0]["detailed_tip"] + "\n"
    s += "Tip 2:" + forks[1]["detailed_tip"] + "\n"
    s += "In summary" + sgl.gen("summary", max_tokens=16)


@sgl.function
def tool_use(s, question):
    s += "To answer this question: " + question + ". "
    s += "I need to use a " + sgl.gen("tool", choices=["calculator", "search engine"]) + ". "
    if s["tool"] == "calculator":
        s += "The math expression is" + sgl.gen("expression", max_tokens=12)
    elif s["tool"] == "search engine":
        s += "The key word to search is" + sgl.gen("word", max_tokens=12)


@sgl.function
def regular_expression_gen(s):
    s += "Q: What is the IP address of the Google DNS servers?\n"
    s += "A: " + sgl.gen(
        "answer",
        temperature=0,
        regex=r"((25[0-5]|2[0-4]\d|[01]?\d\d?).){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
    )


def test_sglang_documentation_programs(backend):
    sgl.set_default_backend(backend)
    try:
        state = few_shot_qa.run(question="What is the capital of the United States?", max_new_tokens=8)
        assert state.error() is None and "\n" not in state["answer"] and state["answer"].strip()

        state = multi_turn_question.run(
            question_1="What is the capital of the United States?", question_2="List two local attractions."
        )
        assert [m["role"] for m in state.messages()] == ["system", "user", "assistant", "user", "assistant"]
        assert state["answer_1"] and state["answer_2"]

        state = tip_suggestion.run()
        assert state.error() is None and "Tip 2:" in state.text() and isinstance(state["summary"], str)

        states = tool_use.run_batch([{"question": "What is 25 * 4?"}, {"question": "Who wrote Hamlet?"}], temperature=0)
        for state in states:
            assert state["tool"] in ("calculator", "search engine")
            assert ("expression" if state["tool"] == "calculator" else "word") in state

        state = regular_expression_gen.run()
        assert re.fullmatch(r"((25[0-5]|2[0-4]\d|[01]?\d\d?).){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)", state["answer"])
    finally:
        sgl.set_default_backend(None)


# ---- examples -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "example",
    [
        "quickstart",
        "multi_step_analysis",
        "json_extraction",
        "fork_and_vote",
        "few_shot_classification",
        "streaming_chat",
    ],
)
def test_example_runs_in_quick_mode(server, example):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{example}.py"), "--quick", "--url", server.url],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip()
