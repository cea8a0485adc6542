"""The frontend's IR, interpreter, states and choice scoring against a fake backend (no model,
no server): fast, and exact about what is sent."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time

import pytest

import langrt_frontend as sgl
from langrt_frontend import ir
from langrt_frontend.chat_template import TEMPLATES, derive_from_jinja, resolve_chat_template
from langrt_frontend.select import choice_tokens

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class FakeBackend:
    """Answers /generate payloads like a server whose tokens are single characters.

    gen: replies `reply(prompt)` (default "<k>" with k counting gens). Prefill-only requests
    report per-character input logprobs from `logprob(context, char)`."""

    def __init__(self, template=TEMPLATES["chatml"], reply=None, logprob=None, gate=None):
        self.chat_template = template
        self.calls: list[dict] = []
        self.reply = reply
        self.logprob = logprob or (lambda context, char: -1.0)
        self.gate = gate  # a Barrier every gen waits at: sequential callers would time out
        self.lock = threading.Lock()
        self.fail_with: Exception | None = None

    def generate(self, payload):
        with self.lock:
            self.calls.append(payload)
            count = len(self.calls)
        if self.fail_with is not None:
            raise self.fail_with
        texts = payload["text"] if isinstance(payload["text"], list) else [payload["text"]]
        starts = payload.get("logprob_start_len", 0)
        starts = starts if isinstance(starts, list) else [starts] * len(texts)
        params = payload["sampling_params"]
        if params.get("max_new_tokens") == 0:
            out = [self._prefill(t, s) for t, s in zip(texts, starts)]
            return out if isinstance(payload["text"], list) else out[0]
        if self.gate is not None:
            self.gate.wait(timeout=5)
        n = params.get("n", 1)
        outs = [self._gen(texts[0], count, j) for j in range(n)]
        return outs if n > 1 else outs[0]

    def _gen(self, prompt, count, j):
        text = self.reply(prompt) if self.reply else f"<{count}.{j}>"
        meta = {"prompt_tokens": len(prompt), "completion_tokens": len(text), "cached_tokens": 0}
        return {"text": text, "output_ids": [ord(c) for c in text], "meta_info": meta}

    def _prefill(self, text, start):
        entries = [
            [None if i == 0 else self.logprob(text[:i], text[i]), ord(text[i]), text[i]]
            for i in range(start, len(text))
        ]
        meta = {"prompt_tokens": len(text), "input_token_logprobs": entries, "output_token_logprobs": []}
        return {"text": "", "output_ids": [], "meta_info": meta}

    def generate_stream(self, payload):
        result = self.generate(payload)
        for i in range(1, len(result["text"]) + 1):
            time.sleep(0.01)  # a token at a time, so readers see increments
            yield {"text": result["text"][:i], "meta_info": result["meta_info"]}

    def flush_cache(self):
        return True

    def get_server_info(self):
        return {"running_requests": 0}

    def get_model_info(self):
        return {"model_path": "fake", "chat_template": None}

    @property
    def gens(self):
        return [c for c in self.calls if c["sampling_params"].get("max_new_tokens") != 0]


def run(program, backend=None, **kwargs):
    return program.run(backend=backend or FakeBackend(), **kwargs)


# ---- expressions and parameters ------------------------------------------------------------------


def test_expressions_concatenate_with_strings_on_either_side():
    expr = "a" + sgl.gen("x") + "b"
    assert isinstance(expr, ir.ExprList)
    assert [type(i) for i in expr.items] == [ir.Text, ir.Gen, ir.Text]
    assert sgl.user_begin() + "x" + sgl.user_end() == sgl.user("x")
    assert sgl.system() == ir.ExprList((ir.RoleBegin("system"), ir.RoleEnd("system")))
    with pytest.raises(TypeError):
        sgl.gen("x") + 3
    with pytest.raises(dataclasses_frozen_error()):
        sgl.gen("x").name = "y"


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_gen_checks_regex_and_dtype_when_called():
    with pytest.raises(re.error):
        sgl.gen("x", regex="(unclosed")
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)
    with pytest.raises(AssertionError):
        sgl.select("x")
    assert isinstance(sgl.gen("x", choices=["a", "b"]), ir.Select)


def test_function_decorator_forms_and_bind():
    @sgl.function
    def bare(s, a, b=1):
        s += f"{a}{b}"

    @sgl.function(num_api_spec_tokens=8)
    def called(s):
        s += "hi"

    assert isinstance(bare, sgl.SglFunction) and isinstance(called, sgl.SglFunction)
    with pytest.raises(AssertionError):
        sgl.function(lambda state: None)
    with pytest.raises(AssertionError):
        bare.bind(c=2)
    assert run(bare.bind(a="x", b=2)).text() == "x2"
    assert run(called).text() == "hi"


def test_gen_request_carries_params_with_run_defaults_and_template_stops():
    backend = FakeBackend()

    @sgl.function
    def f(s):
        s += (
            "Q: "
            + sgl.gen("a", max_tokens=7, stop="\n", top_k=5, json_schema={"type": "object"})
            + sgl.gen("b", dtype=int)
        )

    state = f.run(backend=backend, temperature=0.5, max_new_tokens=99, return_logprob=True)
    state.sync()
    first, second = backend.gens
    assert first["text"] == "Q: "
    params = first["sampling_params"]
    assert params["max_new_tokens"] == 7 and params["temperature"] == 0.5 and params["top_k"] == 5
    assert params["stop"] == ["\n", "<|im_end|>"], "the template's stop strings are added"
    assert json.loads(params["json_schema"]) == {"type": "object"}
    assert first["return_logprob"] is True
    second_params = second["sampling_params"]
    assert second_params["regex"].startswith(r"[-+]?[0-9]+") and second_params["max_new_tokens"] == 99
    assert {" ", "\n"} <= set(second_params["stop"])
    assert state["a"] == "<1.0>" and state.text() == "Q: <1.0><2.0>"
    assert state.get_meta_info("a")["prompt_tokens"] == 3


def test_dtype_regexes_and_dtype_wins_over_regex():
    from langrt_frontend.params import GenParams

    expected = {int: r"[-+]?[0-9]+", "float": r"[-+]?[0-9]*\.?[0-9]+", bool: r"(True|False)", "str": r'"[\w\d\s]*"'}
    for dtype, regex in expected.items():
        assert GenParams(dtype=dtype, regex="x+").sampling_params()["regex"] in (regex, regex + r"[ \n]?")


# ---- state --------------------------------------------------------------------------------------


def test_state_variables_text_and_errors():
    @sgl.function
    def f(s):
        s += "x" + sgl.gen("a")
        s["manual"] = 5
        return "done"

    state = run(f)
    assert state["a"] == "<1.0>" and state["manual"] == 5 and "a" in state and "nope" not in state
    assert state.ret_value == "done"
    with pytest.raises(KeyError):
        state["nope"]
    assert state.error() is None
    assert repr(state) == "ProgramState('x<1.0>')"

    @sgl.function
    def appends_none(s):
        s += None

    with pytest.raises(ValueError):
        run(appends_none)


def test_program_exception_propagates_from_run():
    @sgl.function
    def f(s):
        s += "x"
        raise ZeroDivisionError("in the body")

    with pytest.raises(ZeroDivisionError, match="in the body"):
        run(f)


def test_server_failure_is_recorded_and_stops_the_program():
    backend = FakeBackend()
    backend.fail_with = RuntimeError("POST /generate failed with HTTP 400: max_new_tokens must be >= 0")

    @sgl.function
    def f(s):
        s += "x" + sgl.gen("a") + "after" + sgl.gen("b")

    state = f.run(backend=backend)
    assert isinstance(state.error(), RuntimeError) and "max_new_tokens" in str(state.error())
    assert len(backend.calls) == 1, "nothing runs after the failure"
    with pytest.raises(KeyError, match="not set"):
        state["a"]


def test_reading_a_variable_waits_for_it():
    release = threading.Event()

    def slow_reply(prompt):
        release.wait(5)
        return "late"

    @sgl.function
    def f(s):
        s += sgl.gen("a")

    state = run(f, FakeBackend(reply=slow_reply))
    threading.Timer(0.2, release.set).start()
    assert state["a"] == "late" and release.is_set(), "read only once the reply came, after the release"


def test_roles_use_the_template_and_make_messages():
    template = resolve_chat_template({"chat_template": SMOLLM2_TEMPLATE, "stop_strings": ["<|im_end|>"]})

    @sgl.function
    def f(s):
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.gen("a", max_tokens=4))
        with s.user():
            s += "More"

    assert template.name == "chatml", "SmolLM2's template has ChatML's role markers"
    state = run(f, FakeBackend(template=template))
    assert state.text() == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<1.0><|im_end|>\n<|im_start|>user\nMore<|im_end|>\n"
    )
    assert state.messages() == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<1.0>"},
        {"role": "user", "content": "More"},
    ]


def test_a_default_system_prompt_comes_first():
    @sgl.function
    def f(s, first_role):
        s += first_role("Hello")

    qwen = FakeBackend(template=sgl.get_chat_template("qwen"))
    assert run(f, qwen, first_role=sgl.user).messages() == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello"},
    ]
    assert run(f, qwen, first_role=sgl.system).messages() == [{"role": "system", "content": "Hello"}]
    custom = derive_from_jinja(
        "{% if messages[0]['role'] != 'system' %}<s>[system]Be brief.</s>{% endif %}"
        "{% for m in messages %}<s>[{{ m['role'] }}]{{ m['content'] }}</s>{% endfor %}"
    )
    assert custom.name == "model" and custom.default_system_prompt == "Be brief."
    assert (
        run(f, FakeBackend(template=custom), first_role=sgl.user).text() == "<s>[system]Be brief.</s><s>[user]Hello</s>"
    )


def test_nested_roles_are_an_error():
    @sgl.function
    def f(s):
        s += sgl.user_begin() + sgl.assistant("x")

    state = run(f)
    assert isinstance(state.error(), RuntimeError) and "nested" in str(state.error())


def test_var_scope_and_copy():
    @sgl.function
    def f(s):
        with s.var_scope("scoped"):
            s += "inside " + sgl.gen("a")
        s += " outside"
        with s.copy() as c:
            c += " child" + sgl.gen("b")

    state = run(f)
    assert state["scoped"] == "inside <1.0>"
    assert state["b"] == ["<2.0>"] and state.text() == "inside <1.0> outside"


def test_fork_join_modes_and_fork_additions():
    @sgl.function
    def f(s, mode):
        s += "P"
        forks = s.fork(3)
        forks += "|"
        forks += [f"{i}" for i in range(3)]
        forks += lambda i: sgl.gen("g") + f"#{i}"
        forks.join(mode)

    gathered = run(f, mode="gather_variable")
    assert gathered.text() == "P"
    assert sorted(gathered["g"]) == ["<2.0>", "<3.0>", "<4.0>"] and len(gathered.get_meta_info("g")) == 3
    concat = run(f, mode="concate_and_append")
    assert re.fullmatch(r"P\|0<\d\.0>#0\|1<\d\.0>#1\|2<\d\.0>#2", concat.text())
    with pytest.raises(ValueError):
        run(f, mode="bogus")


def test_gather_keeps_fork_order():
    backend = FakeBackend(reply=lambda prompt: prompt[-1])

    @sgl.function
    def f(s):
        forks = s.fork(4)
        forks += lambda i: f"x{i}" + sgl.gen("v")
        forks.join()

    assert run(f, backend)["v"] == ["0", "1", "2", "3"]


def test_fork_prefills_the_shared_text_once_first():
    backend = FakeBackend()

    @sgl.function
    def f(s):
        s += "shared"
        forks = s.fork(2)
        forks += sgl.gen("v")
        forks.join()

    run(f, backend).sync()
    assert backend.calls[0] == {"text": "shared", "sampling_params": {"max_new_tokens": 0}}
    assert [c["text"] for c in backend.calls[1:]] == ["shared", "shared"]


def test_no_fork_warm_ups_against_a_runtime_without_a_prefix_cache():
    backend = FakeBackend()
    backend.caches_prefixes = False  # as RuntimeEndpoint reports a --disable-radix-cache server

    @sgl.function
    def f(s, word):
        s += "A long shared preamble that run_batch would warm. " + word
        forks = s.fork(2)
        forks += sgl.gen("v")
        forks.join()

    states = f.run_batch([{"word": w} for w in ("x", "y")], backend=backend)
    assert all(s.error() is None for s in states)
    # run_batch's one warm-up (it also learns the shared prefix's token count), no fork commits.
    warm_ups = [c for c in backend.calls if c["sampling_params"] == {"max_new_tokens": 0}]
    assert len(backend.calls) == 5 and warm_ups == [backend.calls[0]]


def test_forks_send_their_requests_concurrently():
    backend = FakeBackend(gate=threading.Barrier(4))

    @sgl.function
    def f(s):
        forks = s.fork(4)
        forks += sgl.gen("v")
        forks.join()

    state = run(f, backend)
    assert state.error() is None and len(state["v"]) == 4, "a sequential interpreter breaks the barrier"


def test_n_samples_store_a_list_and_append_the_first():
    @sgl.function
    def f(s):
        s += sgl.gen("v", n=3)

    state = run(f)
    assert state["v"] == ["<1.0>", "<1.1>", "<1.2>"] and state.text() == "<1.0>"


def test_streaming_increments_concatenate_to_the_text():
    @sgl.function
    def f(s):
        s += "Hello " + sgl.gen("a", max_tokens=5)
        s += " and " + sgl.gen("b")

    state = run(f, stream=True)
    pieces = list(state.text_iter())
    assert len(pieces) > 3 and "".join(pieces) == state.text() == "Hello <1.0> and <2.0>"
    assert "".join(run(f, stream=True).text_iter("b")) == "<2.0>"
    assert list(run(f).text_iter("a")) == ["<1.0>"], "without stream: the final value once"

    async def collect():
        return [piece async for piece in run(f, stream=True).text_async_iter("a", return_meta_data=True)]

    pairs = asyncio.run(collect())
    assert "".join(p for p, _ in pairs) == "<1.0>"


def test_images_need_a_multimodal_runtime(tmp_path):
    path = tmp_path / "pixel.png"
    path.write_bytes(b"\x89PNG fake")
    backend = FakeBackend()

    @sgl.function
    def f(s):
        s += sgl.user(sgl.image(str(path)) + "What is this?") + sgl.gen("a") + sgl.select("b", choices=["x", "y"])

    run(f, backend).sync()
    assert len(backend.calls) == 2 and all(c["image_data"] for c in backend.calls), "images travel with later requests"

    @sgl.function
    def v(s):
        s += sgl.video(str(path), 4)

    assert isinstance(run(v).error(), NotImplementedError)


# ---- select -------------------------------------------------------------------------------------


def preferring(word):
    """Logprobs favouring the characters of `word`."""
    return lambda context, char: -0.1 if char in word else -3.0


@pytest.mark.parametrize(
    "method", [sgl.token_length_normalized, sgl.greedy_token_selection, sgl.unconditional_likelihood_normalized]
)
def test_select_is_one_prefill_request(method):
    backend = FakeBackend(logprob=preferring("Paris"))

    @sgl.function
    def f(s):
        s += "The capital of France is " + sgl.select(
            "city", choices=["London", "Paris", "Rome"], choices_method=method
        )

    state = run(f, backend)
    assert state["city"] == "Paris" and state.text().endswith("is Paris")
    assert len(backend.calls) == 1
    call = backend.calls[0]
    assert call["sampling_params"] == {"max_new_tokens": 0} and call["return_logprob"] is True
    prefix = "The capital of France is "
    expected = [prefix] + [prefix + c for c in ("London", "Paris", "Rome")]
    if method.requires_unconditional:
        expected += ["London", "Paris", "Rome"]
    assert call["text"] == expected
    meta = state.get_meta_info("city")
    assert len(meta["normalized_prompt_logprobs"]) == 3
    assert ["".join(e[2] for e in toks) for toks in meta["input_token_logprobs"]] == ["London", "Paris", "Rome"]
    assert meta["output_token_logprobs"] == [[], [], []]
    extra = {
        "greedy_token_selection": "greedy_logprob_matrix",
        "unconditional_likelihood_normalized": "unconditional_token_logprobs",
    }
    if repr(method) in extra:
        assert extra[repr(method)] in meta


def test_select_ties_go_to_the_earliest_and_temperature_must_be_zero():
    @sgl.function
    def f(s, t=0.0):
        s += "Pick: " + sgl.select("x", choices=["ab", "cd", "ef"], temperature=t)

    assert run(f)["x"] == "ab"
    state = run(f, t=0.5)
    assert isinstance(state.error(), ValueError) and "temperature" in str(state.error())


def test_greedy_selection_pads_short_choices_with_their_mean():
    result = sgl.greedy_token_selection([[[-1.0, 1, "a"]], [[-1.0, 1, "a"], [-0.5, 2, "b"]], [[-2.0, 1, "a"]]])
    # Choice 0 is padded with its mean (-1.0) and loses position 1 to choice 1's -0.5.
    assert result.index == 1 and result.meta["greedy_logprob_matrix"][0] == [-1.0, -1.0]


def test_unconditional_normalization_subtracts_the_choice_alone():
    conditional = [[[-1.0, 1, "a"], [-1.0, 2, "b"]], [[-0.5, 3, "c"]]]
    unconditional = [[[None, 1, "a"], [-4.0, 2, "b"]], [[None, 3, "c"]]]
    result = sgl.unconditional_likelihood_normalized(conditional, unconditional)
    assert result.index == 0, "-1 - (-2) beats -0.5 - 0"
    assert result.meta["normalized_unconditional_prompt_logprobs"] == [1.0, -0.5]


def test_choice_tokens_count_merged_tokens_for_the_choice():
    # prefix "ab" -> [a, b]; "ab" + "c" -> [a, bc]: the merged token counts for the choice.
    prefix = [[None, 1, "a"], [-1.0, 2, "b"]]
    merged = [[None, 1, "a"], [-2.0, 9, "bc"]]
    assert choice_tokens(prefix, merged) == [[-2.0, 9, "bc"]]
    # prefix "abc" -> [ab, c]; "abc" + "d" -> [a, bcd]: "a" is pure prefix and does not count.
    assert choice_tokens([[None, 5, "ab"], [-1.0, 3, "c"]], [[None, 1, "a"], [-3.0, 7, "bcd"]]) == [[-3.0, 7, "bcd"]]


def test_select_starts_logprobs_near_what_earlier_responses_tokenized():
    backend = FakeBackend()

    @sgl.function
    def f(s):
        s += "0123456789" + sgl.gen("a") + " then " + sgl.select("x", choices=["yes", "no"])

    state = run(f, backend)
    assert state["x"] in ("yes", "no")
    select_call = backend.calls[-1]
    assert select_call["logprob_start_len"] == [8, 8, 8], "10 known prompt tokens minus a merge margin of 2"


def test_select_caches_a_long_unknown_prefix_first():
    prefix = "A question whose text is long enough to cache first: "

    @sgl.function
    def f(s):
        s += prefix + sgl.select("x", choices=["yes", "no"])

    backend = FakeBackend()
    assert run(f, backend)["x"] in ("yes", "no")
    commit, select = backend.calls
    assert commit == {"text": prefix, "sampling_params": {"max_new_tokens": 0}}
    assert select["logprob_start_len"] == [len(prefix) - 2] * 3, "the rows compute only their choice"
    cacheless = FakeBackend()
    cacheless.caches_prefixes = False  # caching first would only add a request
    assert run(f, cacheless)["x"] in ("yes", "no") and len(cacheless.calls) == 1
    assert cacheless.calls[0]["logprob_start_len"] == [0, 0, 0]


# ---- run_batch ----------------------------------------------------------------------------------


def test_run_batch_order_forms_and_generator():
    backend = FakeBackend(reply=lambda prompt: prompt.split()[-1].upper())

    @sgl.function
    def f(s, word, suffix="!"):
        s += "Echo " + word + " " + sgl.gen("out") + suffix

    states = f.run_batch([{"word": "a"}, ("b", "?"), {"word": "c"}], backend=backend, progress_bar=True)
    assert [s["out"] for s in states] == ["A", "B", "C"] and states[1].text().endswith("?")
    assert f.run_batch([], backend=backend) == []
    generator = f.run_batch([{"word": w} for w in "xyz"], backend=backend, generator_style=True, num_threads=2)
    assert not isinstance(generator, list) and [s["out"] for s in generator] == ["X", "Y", "Z"]


def test_run_batch_items_run_concurrently():
    backend = FakeBackend(gate=threading.Barrier(5))

    @sgl.function
    def f(s, i):
        s += f"item {i}: " + sgl.gen("v")

    states = f.run_batch([{"i": i} for i in range(5)], backend=backend)
    assert all(s.error() is None for s in states)


def test_run_batch_warms_the_shared_prefix_once_first():
    backend = FakeBackend()
    preamble = "You are a careful classifier of short texts. " * 2

    @sgl.function
    def f(s, text):
        s += sgl.system(preamble)
        s += sgl.user("Text: " + text) + sgl.assistant(sgl.select("label", choices=["good", "bad"]))

    states = f.run_batch([{"text": t} for t in ("fine day", "awful day", "fair day")], backend=backend)
    assert all(s["label"] in ("good", "bad") for s in states)
    warm = backend.calls[0]
    assert warm["sampling_params"] == {"max_new_tokens": 0} and "return_logprob" not in warm
    assert warm["text"] == f"<|im_start|>system\n{preamble}<|im_end|>\n<|im_start|>user\nText: "
    selects = [c for c in backend.calls[1:] if c.get("return_logprob")]
    # Each item's own text ("Text: ...<|im_end|>\n<|im_start|>assistant\n") is long enough to be
    # cached before scoring, so the logprobs start at the end of its whole prefix.
    assert len(selects) == 3 and all(c["logprob_start_len"][0] == len(c["text"][0]) - 2 for c in selects)


# ---- backends and templates ----------------------------------------------------------------------


def test_module_functions_without_a_backend():
    assert sgl.global_config.default_backend is None
    assert sgl.flush_cache() is False and sgl.get_server_info() is None

    @sgl.function
    def f(s):
        s += "x"

    with pytest.raises(RuntimeError, match="backend"):
        f.run()
    with pytest.raises(TypeError, match="not a backend"):
        f.run(backend="http://127.0.0.1:30000")
    backend = FakeBackend()
    sgl.set_default_backend(backend)
    try:
        assert f.run().text() == "x" and sgl.flush_cache() is True and sgl.get_server_info() == {"running_requests": 0}
    finally:
        sgl.set_default_backend(None)


def test_named_and_derived_chat_templates():
    from langrt.entrypoints.chat_templates import TEMPLATES as SERVER_TEMPLATES

    for name in ("chatml", "qwen", "llama-3-instruct"):
        assert derive_from_jinja(SERVER_TEMPLATES[name]) == TEMPLATES[name], name
    assert resolve_chat_template({"chat_template": None, "model_path": "/m/Qwen2.5-7B-Instruct"}).name == "qwen"
    assert resolve_chat_template({"model_path": "Meta-Llama-3-8B-Instruct"}).name == "llama-3-instruct"
    assert resolve_chat_template({"model_path": "my-model"}).name == "default"
    assert resolve_chat_template({"chat_template": SMOLLM2_TEMPLATE}, "llama-3-instruct").name == "llama-3-instruct"
    assert derive_from_jinja("{{ raise_exception('no') }}") is None
    with pytest.raises(ValueError, match="unknown chat template"):
        sgl.get_chat_template("nope")


def test_unreachable_endpoint_raises_at_construction():
    from server_utils import free_port

    with pytest.raises(RuntimeError, match="cannot reach"):
        sgl.RuntimeEndpoint(f"http://127.0.0.1:{free_port()}")


def test_runtime_flags():
    from langrt_frontend.backends.runtime import _flags

    assert _flags({"chunked_prefill_size": 512, "disable_radix_cache": True, "x": False, "y": None}) == [
        "--chunked-prefill-size", "512", "--disable-radix-cache",
    ]  # fmt: skip


def test_import_is_light():
    code = "import sys, langrt_frontend; assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
