"""`gen(name, reasoning=True)` in the frontend against a fake backend: the request carries the
switch and the budget, the answer and the thinking land in two variables (whole, streamed, n
samples), and the program's text keeps the whole output."""

from __future__ import annotations

import langrt_frontend as sgl
from langrt_frontend.reasoning import split_thinking
from test_frontend_unit import FakeBackend

OUTPUT = '<think>\nIs it prime? Yes.\n</think>\n\n{"prime": true}'


def program():
    @sgl.function
    def f(s):
        s += "Q: " + sgl.gen("x", reasoning=True, max_reasoning_tokens=8, json_schema={"type": "object"})

    return f


def test_request_carries_reasoning_and_budget():
    backend = FakeBackend(reply=lambda prompt: OUTPUT)
    state = program().run(backend=backend)
    state.sync()
    params = backend.gens[0]["sampling_params"]
    assert params["reasoning"] is True and params["max_reasoning_tokens"] == 8
    assert state["x"] == '{"prime": true}' and state["x_reasoning"] == "Is it prime? Yes."
    assert state.text() == "Q: " + OUTPUT, "the program's text keeps the thinking (its tokens are cached)"
    assert state.get_meta_info("x")["completion_tokens"] == len(OUTPUT)


def test_streamed_and_sampled_gens_split_alike():
    state = program().run(backend=FakeBackend(reply=lambda prompt: OUTPUT), stream=True)
    assert "".join(state.text_iter()) == "Q: " + OUTPUT
    assert (state["x"], state["x_reasoning"]) == ('{"prime": true}', "Is it prime? Yes.")

    @sgl.function
    def sampled(s):
        s += sgl.gen("y", n=2, reasoning=True)

    state = sampled.run(backend=FakeBackend(reply=lambda prompt: OUTPUT))
    assert state["y"] == ['{"prime": true}'] * 2 and state["y_reasoning"] == ["Is it prime? Yes."] * 2


def test_without_reasoning_nothing_is_split():
    @sgl.function
    def plain(s):
        s += sgl.gen("z")

    backend = FakeBackend(reply=lambda prompt: OUTPUT)
    state = plain.run(backend=backend)
    assert state["z"] == OUTPUT and "reasoning" not in backend.gens[0]["sampling_params"]
    assert "z_reasoning" not in state.sync()


def test_split_thinking():
    assert split_thinking("r1 style</think> answer") == ("r1 style", "answer")
    assert split_thinking("<think>cut short") == ("cut short", ""), "no end tag: no answer yet"
