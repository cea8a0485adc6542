"""The public functions of `langrt_frontend` (docs/programs.md)."""

from __future__ import annotations

from typing import Callable

from langrt_frontend import ir
from langrt_frontend.choices import token_length_normalized
from langrt_frontend.config import global_config
from langrt_frontend.function import SglFunction
from langrt_frontend.params import GenParams


def function(func: Callable | None = None, num_api_spec_tokens: int | None = None):
    """Decorator (bare or called) making `f(s, ...)` a program: an `SglFunction`."""
    if func is None:
        return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)
    return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype=None,
    choices: list[str] | None = None,
    choices_method=None,
    regex: str | None = None,
    json_schema: str | dict | None = None,
    ebnf: str | None = None,
    reasoning: bool | None = None,
    max_reasoning_tokens: int | None = None,
    lora_path: str | None = None,
) -> ir.Expr:
    """Generate into variable `name`. Unset settings inherit from run/run_batch (docs/programs.md, gen).
    With `choices` it is a `select`. With `reasoning` (a runtime with --reasoning-parser) the
    model thinks first, at most `max_reasoning_tokens`: `name` gets the answer, which alone
    the constraint holds, and `name + "_reasoning"` the thinking (langrt_frontend/reasoning.py).
    `lora_path` names the runtime's LoRA adapter to generate with (`run(lora_path=...)`: every gen
    and select of the program)."""
    # every argument but these is a GenParams field of the same name
    settings = {
        k: v for k, v in locals().items() if k not in ("name", "choices", "choices_method", "max_tokens", "min_tokens")
    }
    if choices:
        return select(
            name, choices, 0.0 if temperature is None else temperature, choices_method or token_length_normalized
        )
    params = GenParams(max_new_tokens=max_tokens, min_new_tokens=min_tokens, **settings)
    return ir.Gen(name, params)


def gen_int(name: str | None = None, **params) -> ir.Expr:
    """`gen` whose output is an integer."""
    return gen(name, dtype=int, **params)


def gen_string(name: str | None = None, **params) -> ir.Expr:
    """`gen` whose output is a double-quoted string."""
    return gen(name, dtype=str, **params)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method=token_length_normalized,
) -> ir.Expr:
    """Pick one of `choices` by the logprobs of its tokens after the text so far (docs/programs.md, select)."""
    assert choices is not None, "select needs choices=[...]"
    choices = tuple(choices)
    assert choices and all(isinstance(c, str) for c in choices), "select choices must be a non-empty list of strings"
    return ir.Select(name, choices, temperature, choices_method)


def image(path: str) -> ir.Expr:
    """An image input (a file path, URL or data URI). langrt serves text-only models: a program
    using one stops with the runtime's error at its next gen."""
    return ir.Image(str(path))


def video(path: str, num_frames: int) -> ir.Expr:
    """A video input; not supported by langrt's text-only models (the program stops with an error)."""
    return ir.Video(str(path), num_frames)


def _role(role: str, expr=None) -> ir.ExprList:
    middle = () if expr is None else (ir.as_expr(expr),)
    return ir.ExprList((ir.RoleBegin(role), *middle, ir.RoleEnd(role)))


def system(expr=None) -> ir.ExprList:
    return _role("system", expr)


def user(expr=None) -> ir.ExprList:
    return _role("user", expr)


def assistant(expr=None) -> ir.ExprList:
    return _role("assistant", expr)


def system_begin() -> ir.Expr:
    return ir.RoleBegin("system")


def system_end() -> ir.Expr:
    return ir.RoleEnd("system")


def user_begin() -> ir.Expr:
    return ir.RoleBegin("user")


def user_end() -> ir.Expr:
    return ir.RoleEnd("user")


def assistant_begin() -> ir.Expr:
    return ir.RoleBegin("assistant")


def assistant_end() -> ir.Expr:
    return ir.RoleEnd("assistant")


def set_default_backend(backend) -> None:
    """The backend every `run` uses unless given backend=."""
    global_config.default_backend = backend


def flush_cache(backend=None) -> bool:
    """Empty the runtime's prefix cache; False when there is no backend (or it refuses)."""
    backend = backend or global_config.default_backend
    return False if backend is None else backend.flush_cache()


def get_server_info(backend=None) -> dict | None:
    backend = backend or global_config.default_backend
    return None if backend is None else backend.get_server_info()
