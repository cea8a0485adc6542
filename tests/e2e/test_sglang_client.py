"""SGLang's own frontend (the `sglang` package from PyPI, its `RuntimeEndpoint`) as an outside
client of a live `langrt launch` on the built-in SmolLM2-135M-Instruct: `gen`, `select` with each
of SGLang's three choice methods, `fork`, `run_batch` and streaming, with SGLang's client code
unchanged. `select` is where the client reads most from the server: it sends a prefill-only
request scoring `prefix + choice` from `logprob_start_len = prompt_tokens - 2` (with
`return_text_in_logprobs`), and for unconditional_likelihood_normalized a second prefill-only
request of each choice's token ids alone (no `logprob_start_len`), whose `input_token_logprobs` it
subtracts position by position (the first entry may be null).

Content is asserted only where a 135M model is reliable (greedy answers to trivial questions)."""

from __future__ import annotations

import math
import os

import pytest

from server_utils import LaunchedServer

pytestmark = pytest.mark.slow

METHODS = ["token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized"]


@pytest.fixture(scope="module")
def sgl():
    """SGLang's frontend, imported when these tests run (not when the suite is collected): the
    import takes seconds and points the JIT caches (TRITON_CACHE_DIR, ...) at SGLang's own
    directory, so this process's environment is put back for the tests that follow."""
    environ = dict(os.environ)
    try:
        return pytest.importorskip(
            "sglang",
            reason="SGLang's frontend is not installed (scripts/install.sh installs sglang==0.5.23 "
            "with --no-deps and the few light packages its import needs)",
        )
    finally:
        os.environ.clear()
        os.environ.update(environ)


@pytest.fixture(scope="module")
def server():
    # One torch thread: on a shared 2-core machine two threads spin against other load.
    s = LaunchedServer("--max-total-tokens", "32768", "--num-threads", "1")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def backend(sgl, server):
    # SGLang picks a chat template by model path, which for a GGUF file is its "default"
    # (USER:/ASSISTANT:); SmolLM2 was trained on ChatML, so name it.
    return sgl.RuntimeEndpoint(server.url, chat_template_name="chatml")


@pytest.fixture(scope="module")
def capital(sgl):
    @sgl.function
    def capital(s, question, choices, method):
        s += sgl.user(question)
        s += sgl.assistant(sgl.select("answer", choices=choices, choices_method=getattr(sgl, method)))

    return capital


@pytest.fixture(scope="module")
def qa(sgl):
    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=16))

    return qa


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def assert_entries(entries, *, first_may_be_null: bool = False, with_text: bool = True):
    """[logprob, token_id, text] triples with numeric logprobs (the first may be null where asked)."""
    assert entries, "no logprob entries"
    for i, entry in enumerate(entries):
        assert isinstance(entry, list) and len(entry) == 3, entry
        logprob, token_id, text = entry
        if not (i == 0 and first_may_be_null and logprob is None):
            assert is_number(logprob) and logprob <= 0, entries
        assert isinstance(token_id, int), entries
        if with_text:
            assert isinstance(text, str), entries


def test_gen_answers_with_meta_info(backend, qa):
    state = qa.run(question="What is the capital of France?", temperature=0, backend=backend)
    assert state.error() is None
    assert "Paris" in state["answer"]
    assert state.text().startswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    meta = state.get_meta_info("answer")
    assert meta["prompt_tokens"] > 0 and 0 < meta["completion_tokens"] <= 16
    assert meta["finish_reason"]["type"] in ("stop", "length")


def test_gen_logprobs_are_numeric_triples(sgl, backend):
    @sgl.function
    def f(s):
        s += "The capital of France is"
        s += sgl.gen(
            "rest",
            max_tokens=4,
            return_logprob=True,
            logprob_start_len=3,
            top_logprobs_num=2,
            return_text_in_logprobs=True,
        )

    state = f.run(temperature=0, backend=backend)
    assert state.error() is None
    meta = state.get_meta_info("rest")
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] == 4
    assert_entries(meta["output_token_logprobs"])
    # From position 3 on: every entry scored (only a prompt's first token has no logprob).
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] - 3
    assert_entries(meta["input_token_logprobs"])
    assert "".join(e[2] for e in meta["output_token_logprobs"]) == state["rest"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


@pytest.mark.parametrize("name", METHODS)
def test_select_with_each_choice_method(backend, capital, name):
    choices = ["Paris", "London", "Berlin"]
    state = capital.run(question="What is the capital of France?", choices=choices, method=name, backend=backend)
    assert state.error() is None, state.error()
    assert state["answer"] == "Paris"
    assert state.text().endswith("<|im_start|>assistant\nParis<|im_end|>\n")
    meta = state.get_meta_info("answer")
    assert len(meta["normalized_prompt_logprobs"]) == 3 and all(
        is_number(x) for x in meta["normalized_prompt_logprobs"]
    )
    assert len(meta["input_token_logprobs"]) == 3
    for choice, entries in zip(choices, meta["input_token_logprobs"]):
        assert_entries(entries)
        assert "".join(e[2] for e in entries).endswith(choice)
    assert meta["output_token_logprobs"] == [[], [], []]
    if name == "greedy_token_selection":
        matrix = meta["greedy_logprob_matrix"]
        assert len(matrix) == 3 and all(is_number(x) for row in matrix for x in row)
    if name == "unconditional_likelihood_normalized":
        # Each choice's tokens scored alone: one entry per token, the first (nothing before it) null.
        unconditional = meta["unconditional_token_logprobs"]
        for conditional, alone in zip(meta["input_token_logprobs"], unconditional):
            assert [e[1] for e in alone] == [e[1] for e in conditional]
            assert_entries(alone, first_may_be_null=True, with_text=False)
        scores = meta["normalized_unconditional_prompt_logprobs"]
        assert len(scores) == 3 and all(is_number(x) for x in scores)


def test_select_yes_no_with_each_choice_method(backend, capital):
    for name in METHODS:
        state = capital.run(
            question="Is the sky blue? Answer yes or no.", choices=["yes", "no"], method=name, backend=backend
        )
        assert state.error() is None, (name, state.error())
        assert state["answer"] in ("yes", "no"), name


def test_choices_scored_alone_through_the_native_api(server):
    """The request SGLang's client sends for unconditional_likelihood_normalized: token ids,
    prefill only, return_logprob, no logprob_start_len. Every token comes back, the first null."""
    status, out = server.post(
        "/generate",
        # SmolLM2's token ids of "Paris", and of "Ber" "lin".
        {"input_ids": [[38634], [24726, 4226]], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True},
    )
    assert status == 200 and len(out) == 2
    short, longer = (r["meta_info"]["input_token_logprobs"] for r in out)
    assert short == [[None, 38634, None]]
    assert longer[0] == [None, 24726, None] and longer[1][1] == 4226 and is_number(longer[1][0])
    assert all(r["meta_info"]["output_token_logprobs"] == [] and r["text"] == "" for r in out)


def test_fork_and_join(sgl, backend):
    @sgl.function
    def f(s):
        s += "A list of fruits:"
        forks = s.fork(2)
        forks += [" apple,", " cherry,"]
        forks += sgl.gen("more", max_tokens=3)
        forks.join()
        s += " The end."
        joined = s.fork(2)
        joined += lambda i: f" Statement {i}."
        joined.join("concate_and_append")
        s += sgl.gen("after", max_tokens=3)

    # SGLang joins "concate_and_append" by asking the server to join KV caches by request id
    # (/concate_and_append_request), which langrt answers 501; its text path gives the same text.
    parallel_encoding = sgl.global_config.enable_parallel_encoding
    sgl.global_config.enable_parallel_encoding = False
    try:
        state = f.run(temperature=0, backend=backend)
    finally:
        sgl.global_config.enable_parallel_encoding = parallel_encoding
    assert state.error() is None, state.error()
    assert (
        isinstance(state["more"], list) and len(state["more"]) == 2 and all(isinstance(m, str) for m in state["more"])
    )
    assert "A list of fruits: The end. Statement 0. Statement 1." in state.text()
    assert state.text().endswith(state["after"])


def test_run_batch(backend, qa, capital):
    questions = ["What is the capital of France?", "What is the capital of Italy?", "What is the capital of Japan?"]
    states = qa.run_batch([{"question": q} for q in questions], temperature=0, backend=backend)
    assert [s.error() for s in states] == [None] * 3
    for state, city in zip(states, ["Paris", "Rome", "Tokyo"]):
        assert city in state["answer"]
    selects = capital.run_batch(
        [{"question": "What is the capital of France?", "choices": ["Paris", "London"], "method": m} for m in METHODS],
        backend=backend,
    )
    assert [s.error() for s in selects] == [None] * 3
    assert [s["answer"] for s in selects] == ["Paris"] * 3


def test_streaming(sgl, backend):
    @sgl.function
    def f(s):
        s += sgl.user("Write a sentence about the sea.") + sgl.assistant(
            sgl.gen("line", max_tokens=10, ignore_eos=True)
        )

    state = f.run(stream=True, temperature=0, backend=backend)
    pieces = list(state.text_iter("line"))
    assert len(pieces) > 1 and "".join(pieces) == state["line"]
    assert state.get_meta_info("line")["completion_tokens"] == 10
    whole = f.run(stream=True, temperature=0, backend=backend)
    assert "".join(whole.text_iter()) == whole.text()
    assert whole["line"] == state["line"]
