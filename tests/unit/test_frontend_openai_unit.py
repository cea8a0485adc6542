"""The frontend's OpenAI backend against a fake OpenAI-compatible server (stdlib HTTP, canned
answers, every request body kept): what each primitive sends, per kind of server, what comes
back into the program state, and what is refused, naming the primitive and the server."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import langrt_frontend as sgl
from langrt_frontend.backends.gbnf import UnsupportedRegex, choices_to_gbnf, regex_to_gbnf
from langrt_frontend.params import BOOL_REGEX, FLOAT_REGEX, INT_REGEX


class FakeServer:
    """Answers POST /v1/... with `answer(path, body)` (a dict; or a list of SSE events when the
    body streams; or (status, dict)). GET probes answer from `gets` (path -> (status, body))."""

    def __init__(self, answer=None, gets=None):
        self.requests: list[tuple[str, dict]] = []
        self.answer = answer or (lambda path, body: chat_answer("ok"))
        self.gets = gets or {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                status, body = fake.gets.get(self.path, (404, {"detail": "Not Found"}))
                self._send(status, body)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.path, body))
                result = fake.answer(self.path, body)
                status, result = result if isinstance(result, tuple) else (200, result)
                if isinstance(result, list):
                    self._send_events(result)
                else:
                    self._send(status, result)

            def _send(self, status, body):
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _send_events(self, events):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for event in [*events, "[DONE]"]:
                    data = event if isinstance(event, str) else json.dumps(event)
                    self.wfile.write(f"data: {data}\r\n\r\n".encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()

    def bodies(self, path=None) -> list[dict]:
        return [b for p, b in self.requests if path is None or p == path]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_answer(*texts, finish="stop"):
    choices = [
        {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": finish}
        for i, t in enumerate(texts)
    ]
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": choices,
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}  # fmt: skip


def completion_answer(text, finish="stop"):
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}  # fmt: skip


LANGRT_PROBES = {"/get_model_info": (200, {"model_path": "builtin", "chat_template": None})}


@pytest.fixture
def fake():
    servers = []

    def make(answer=None, gets=None):
        servers.append(FakeServer(answer, gets))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@sgl.function
def qa(s, question, **gen_kwargs):
    s += sgl.system("Be brief.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", **gen_kwargs))


# ---- what is sent ------------------------------------------------------------------------------


def test_chat_model_sends_role_blocks_as_messages_and_maps_sampling(fake):
    server = fake(gets=LANGRT_PROBES)
    backend = sgl.OpenAI("m", base_url=server.url, api_key="k")
    state = qa.run("Capital of France?", max_tokens=9, stop=["\n"], top_k=5, temperature=0, backend=backend)
    assert state.error() is None and state["answer"] == "ok"
    ((path, body),) = server.requests
    assert path == "/v1/chat/completions"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
    ]
    assert body["model"] == "m" and body["max_tokens"] == 9 and body["stop"] == ["\n"] and body["temperature"] == 0
    assert body["top_k"] == 5 and "min_p" not in body and "ignore_eos" not in body, "defaults are left out"
    assert state.messages()[-1] == {"role": "assistant", "content": "ok"}
    meta = state.get_meta_info("answer")
    assert meta["finish_reason"] == {"type": "stop"} and meta["prompt_tokens"] == 7 and meta["completion_tokens"] == 3


def test_completion_model_sends_the_text_with_the_servers_template(fake):
    gets = {"/get_model_info": (200, {"model_path": "qwen2-7b-instruct", "chat_template": None})}
    server = fake(answer=lambda path, body: completion_answer("Paris"), gets=gets)
    backend = sgl.OpenAI("m", base_url=server.url, is_chat_model=False)
    assert backend.chat_template.name == "qwen", "a completion model's template comes from the server's model info"
    state = qa.run("Capital?", max_tokens=4, backend=backend).sync()
    ((path, body),) = server.requests
    assert path == "/v1/completions" and state["answer"] == "Paris"
    assert (
        body["prompt"]
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert body["stop"] == ["<|im_end|>"], "the template's stop string is added, as for the native backends"


def test_constraint_fields_per_kind_of_server(fake):
    @sgl.function
    def constrained(s):
        s += sgl.user("q")
        s += sgl.assistant(sgl.gen("a", regex=r"[0-9]{3}", max_tokens=5))
        s += sgl.user("q") + sgl.assistant(sgl.gen_int("b"))
        s += sgl.user("q") + sgl.assistant(sgl.gen("c", json_schema={"type": "object"}))

    answers = iter(["123", "42", "{}"] * 2)
    langrt = fake(lambda path, body: chat_answer(next(answers)), gets=LANGRT_PROBES)
    assert constrained.run(backend=sgl.OpenAI("m", base_url=langrt.url)).error() is None
    regex, dtype, schema = langrt.bodies()
    assert regex["regex"] == "[0-9]{3}" and dtype["regex"] == INT_REGEX + r"[ \n]?" and dtype["stop"] == [" ", "\n"]
    assert schema["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": {"type": "object"}},
    }

    llama = fake(lambda path, body: chat_answer(next(answers)), gets={"/props": (200, {})})
    backend = sgl.OpenAI("m", base_url=llama.url)
    assert (backend.constraints.name, backend.server_kind) == ("gbnf", "llama.cpp")
    assert constrained.run(backend=backend).error() is None
    regex, dtype, schema = llama.bodies()
    assert regex["grammar"] == regex_to_gbnf("[0-9]{3}") and "regex" not in regex
    assert dtype["grammar"] == regex_to_gbnf(INT_REGEX + r"[ \n]?")
    assert schema["response_format"] == {"type": "json_object", "schema": {"type": "object"}}


def test_select_on_a_chat_model_is_a_constrained_choice_that_repeats_the_assistant_text(fake):
    server = fake(lambda path, body: chat_answer("The answer is Yes"), gets=LANGRT_PROBES)

    @sgl.function
    def check(s):
        s += sgl.user("Is water wet?")
        s += sgl.assistant("The answer is " + sgl.select("verdict", choices=["Yes", "No"]))

    state = check.run(backend=sgl.OpenAI("m", base_url=server.url))
    assert state.error() is None and state["verdict"] == "Yes"
    (body,) = server.bodies()
    assert re.fullmatch(body["regex"], "The answer is Yes") and re.fullmatch(body["regex"], "The answer is No")
    assert not re.fullmatch(body["regex"], "Yes") and body["temperature"] == 0
    assert body["messages"] == [{"role": "user", "content": "Is water wet?"}], (
        "the begun assistant text is not a message"
    )
    assert state.messages()[-1]["content"] == "The answer is Yes"
    assert state.get_meta_info("verdict")["choices_method"] == "constrained decoding"


def test_dtype_after_assistant_text_applies_the_stops_itself(fake):
    """The repeated text "I am " holds dtype int's stop " ": the server must not stop there."""
    server = fake(lambda path, body: chat_answer("I am 25 "), gets=LANGRT_PROBES)

    @sgl.function
    def age(s):
        s += sgl.user("How old are you?") + sgl.assistant("I am " + sgl.gen_int("age", max_tokens=4))

    state = age.run(backend=sgl.OpenAI("m", base_url=server.url))
    assert state.error() is None and state["age"] == "25"
    (body,) = server.bodies()
    assert "stop" not in body and re.fullmatch(body["regex"], "I am 25 ") and not re.fullmatch(body["regex"], "25")
    assert body["max_tokens"] == 4 + len("I am ") + 2, "room for the repeated text"


def test_select_on_a_completion_model_scores_echoed_prompt_logprobs(fake):
    """langrt's /v1/completions echo: [prefix, prefix + each choice], one token per character."""

    def answer(path, body):
        rows = []
        for i, prompt in enumerate(body["prompt"]):
            tokens = list(prompt)
            logprobs = [None] + [-0.5 if "b" in t else -2.0 for t in tokens[1:]]
            rows.append({"index": i, "text": prompt, "finish_reason": "length",
                         "logprobs": {"tokens": tokens, "token_logprobs": logprobs, "text_offset": list(range(len(tokens)))}})  # fmt: skip
        return {"id": "cmpl", "choices": rows, "usage": {}}

    server = fake(answer, gets=LANGRT_PROBES)

    @sgl.function
    def pick(s):
        s += "Q: " + sgl.select("x", choices=["aa", "bb", "ab"])

    state = pick.run(backend=sgl.OpenAI("m", base_url=server.url, is_chat_model=False)).sync()
    assert state.error() is None and state["x"] == "bb"
    (body,) = server.bodies("/v1/completions")
    assert body["prompt"] == ["Q: ", "Q: aa", "Q: bb", "Q: ab"] and body["echo"] is True and body["max_tokens"] == 0
    assert state.get_meta_info("x")["normalized_prompt_logprobs"] == [-2.0, -0.5, -1.25]


def test_streaming_yields_the_servers_increments(fake):
    def answer(path, body):
        assert body["stream"] is True
        chunks = [
            {"id": "c", "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            for piece in ("Hel", "lo", "!")
        ]
        chunks[-1]["choices"][0]["finish_reason"] = "stop"
        return chunks + [{"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}]

    server = fake(answer, gets=LANGRT_PROBES)
    state = qa.run("Hi", stream=True, backend=sgl.OpenAI("m", base_url=server.url))
    assert "".join(state.text_iter("answer")) == "Hello!"  # increments may coalesce while the reader lags
    assert server.bodies()[0]["stream_options"] == {"include_usage": True}
    assert state["answer"] == "Hello!" and state.get_meta_info("answer")["completion_tokens"] == 3
    assert state.get_meta_info("answer")["finish_reason"] == {"type": "stop"}


def test_n_samples_and_a_server_that_ignores_n(fake):
    server = fake(lambda path, body: chat_answer(*["a", "b", "c"][: body["n"]]), gets=LANGRT_PROBES)
    state = qa.run("q", n=3, backend=sgl.OpenAI("m", base_url=server.url))
    assert state["answer"] == ["a", "b", "c"] and state.messages()[-1]["content"] == "a"
    one = fake(lambda path, body: chat_answer("a"), gets={"/props": (200, {})})
    error = qa.run("q", n=2, backend=sgl.OpenAI("m", base_url=one.url)).error()
    assert isinstance(error, sgl.UnsupportedPrimitive) and "gen(n=2)" in str(error) and one.url in str(error)


# ---- what is refused, by name ------------------------------------------------------------------


@pytest.mark.parametrize(
    "gets, kwargs, names",
    [
        ({}, {"regex": "[0-9]+"}, ["gen(regex)", "no regex"]),
        ({}, {"dtype": int}, ["gen(dtype=int)"]),
        ({}, {"top_k": 3}, ["gen(top_k=3)"]),
        (LANGRT_PROBES, {"stop_regex": "x"}, ["gen(stop_regex)"]),
        (LANGRT_PROBES, {"logprob_start_len": 0}, ["gen(logprob_start_len)"]),
        ({"/props": (200, {})}, {"regex": r"(a)\1"}, ["gen(regex)", "GBNF", "groupref"]),
        ({"/props": (200, {})}, {"ignore_eos": True}, ["gen(ignore_eos=True)"]),
    ],
)
def test_refusals_name_the_primitive_and_the_server(fake, gets, kwargs, names):
    server = fake(gets=gets)
    error = qa.run("q", backend=sgl.OpenAI("m", base_url=server.url), **kwargs).error()
    assert isinstance(error, sgl.UnsupportedPrimitive), error
    for name in names + [server.url]:
        assert name in str(error)
    assert server.requests == [], "refused before anything is sent"


def test_chat_primitives_outside_an_assistant_block_or_after_its_text_are_refused(fake):
    server = fake(gets=LANGRT_PROBES)
    backend = sgl.OpenAI("m", base_url=server.url)

    @sgl.function
    def in_user(s):
        s += sgl.user("Say " + sgl.gen("x"))

    @sgl.function
    def no_role(s):
        s += "Sentiment: " + sgl.select("x", choices=["good", "bad"])

    @sgl.function
    def after_text(s):
        s += sgl.user("q") + sgl.assistant("Sure: " + sgl.gen("x"))

    assert "in a user block" in str(in_user.run(backend=backend).error())
    assert "select" in str(no_role.run(backend=backend).error()) and "outside any role block" in str(
        no_role.run(backend=backend).error()
    )
    assert server.requests == []
    # a server that cannot continue an assistant message (not langrt or SGLang) refuses it
    plain = fake()
    error = after_text.run(backend=sgl.OpenAI("m", base_url=plain.url)).error()
    assert isinstance(error, sgl.UnsupportedPrimitive) and "already begun" in str(error) and "'Sure: '" in str(error)
    assert plain.requests == []


def test_a_begun_assistant_message_is_continued_on_langrt(fake):
    """langrt and SGLang continue the final assistant message (continue_final_message): the
    begun text goes as that message, and the output is what follows it."""
    server = fake(gets=LANGRT_PROBES)

    @sgl.function
    def after_text(s):
        s += sgl.user("q") + sgl.assistant("Sure: " + sgl.gen("x", max_tokens=4))

    state = after_text.run(backend=sgl.OpenAI("m", base_url=server.url), temperature=0)
    assert state.error() is None and state["x"] == "ok"
    ((_, body),) = server.requests
    assert body["continue_final_message"] is True and body["max_tokens"] == 4
    assert body["messages"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Sure: "}]
    assert state.messages()[-1] == {"role": "assistant", "content": "Sure: ok"}


def test_images_are_refused_by_name(fake, tmp_path):
    server = fake(gets=LANGRT_PROBES)
    picture = tmp_path / "p.png"
    picture.write_bytes(b"\x89PNG")

    @sgl.function
    def look(s):
        s += sgl.user(sgl.image(str(picture)) + "What is this?")
        s += sgl.assistant(sgl.gen("x"))

    error = look.run(backend=sgl.OpenAI("m", base_url=server.url)).error()
    assert isinstance(error, sgl.UnsupportedPrimitive) and str(error).startswith("image:")


def test_a_server_that_ignores_the_constraint_is_caught(fake):
    """llama-cpp-python ignores fields it does not know: unconstrained text must not pass."""
    server = fake(lambda path, body: chat_answer("twelve"), gets=LANGRT_PROBES)
    error = qa.run("q", regex="[0-9]+", backend=sgl.OpenAI("m", base_url=server.url)).error()
    assert "gen(regex)" in str(error) and "does not match" in str(error) and server.url in str(error)
    cut = fake(lambda path, body: chat_answer("twel", finish="length"), gets=LANGRT_PROBES)
    assert qa.run("q", regex="[0-9]+", backend=sgl.OpenAI("m", base_url=cut.url))["answer"] == "twel", (
        "cut off: not checked"
    )


def test_a_server_error_names_the_primitive_and_the_server(fake):
    bad = {
        "error": {
            "message": "unknown field 'grammar'",
            "type": "invalid_request_error",
            "param": "grammar",
            "code": 400,
        }
    }
    server = fake(lambda path, body: (400, bad))
    error = qa.run("q", regex="[0-9]+", backend=sgl.OpenAI("m", base_url=server.url, constraints="gbnf")).error()
    assert isinstance(error, RuntimeError) and "gen(regex)" in str(error) and server.url in str(error)
    assert "unknown field 'grammar'" in str(error)


def test_probing_picks_the_constraints_and_an_unreachable_server_is_an_error(fake):
    llama_python = fake(
        gets={"/openapi.json": (200, {"openapi": "3.1.0", "info": {"title": "🦙 llama.cpp Python API"}})}
    )
    assert sgl.OpenAI("m", base_url=llama_python.url).constraints.name == "gbnf"
    hosted = fake()
    assert sgl.OpenAI("m", base_url=hosted.url).constraints.name == "none"
    assert sgl.OpenAI("gpt-3.5-turbo-instruct", base_url=hosted.url).is_chat_model is False
    with pytest.raises(RuntimeError, match="cannot reach an OpenAI-compatible server"):
        sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1")
    explicit = sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1", constraints="regex")
    assert explicit.constraints.name == "regex" and explicit.flush_cache() is False, "no probe when told"


# ---- regex -> GBNF -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, expected",
    [
        (INT_REGEX, r"root ::= ([\x2D\x2B])? ([0-9])+"),
        (BOOL_REGEX, 'root ::= (("True" | "False"))'),
        (r"\d{3}-\w{2,}", r'root ::= ([0-9]){3} "\x2D" ([a-zA-Z0-9_]){2,}'),
        (r'^a"b.$', r'root ::= "a\x22b" [^\x0A]'),
        (r"[^\s]+é", r'root ::= ([^ \t\n\r\x0B\x0C])+ "\xE9"'),
    ],
)
def test_regex_to_gbnf(pattern, expected):
    assert regex_to_gbnf(pattern) == expected


def test_regex_to_gbnf_refuses_what_gbnf_cannot_say():
    for pattern in (r"(a)\1", r"(?=a)a", r"\bx", r"(?i)abc", r"a++"):
        with pytest.raises(UnsupportedRegex):
            regex_to_gbnf(pattern)
    assert choices_to_gbnf(["a b", 'c"'], prefix="Is: ") == r'root ::= "Is\x3A " ("a b" | "c\x22")'
    assert regex_to_gbnf(FLOAT_REGEX, prefix="x") == r'root ::= "x" ([\x2D\x2B])? ([0-9])* ("\x2E")? ([0-9])+'


def test_grammars_parse_in_llama_cpp():
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    for grammar in (
        regex_to_gbnf(r"[A-Z][a-z]{2,5}\. (yes|no)?"),
        regex_to_gbnf(r"[\-\]x]*"),
        choices_to_gbnf(["x", "y"], "é: "),
    ):
        llama_cpp.LlamaGrammar.from_string(grammar, verbose=False)
