"""langrt's frontend: SGLang programs run unchanged after `import langrt_frontend as sgl`.

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=64))

    sgl.set_default_backend(sgl.RuntimeEndpoint("http://127.0.0.1:30000"))
    print(qa.run(question="What is the capital of France?")["answer"])

Module map: api (the functions below), ir (nodes), params (gen settings), executor (the
interpreter: one thread per program state), state (ProgramState, ForkedStates), function
(SglFunction: run, run_batch, bind), tracing (shared-prefix warm-up), select (one-request
choice scoring), choices (choice methods), chat_template, backends/ (RuntimeEndpoint over HTTP,
Runtime = a launched server, EngineBackend = an in-process langrt.Engine, OpenAI = any
OpenAI-compatible server).
"""

from langrt_frontend.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    image,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from langrt_frontend.backends.endpoint import RuntimeEndpoint
from langrt_frontend.backends.constraints import UnsupportedPrimitive
from langrt_frontend.backends.engine import EngineBackend
from langrt_frontend.backends.openai_backend import OpenAI
from langrt_frontend.backends.runtime import Runtime
from langrt_frontend.chat_template import ChatTemplate, get_chat_template
from langrt_frontend.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from langrt_frontend.config import global_config
from langrt_frontend.function import SglFunction
from langrt_frontend.state import ForkedStates, ProgramState

__all__ = [
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_server_info",
    "image",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
    "video",
    "RuntimeEndpoint",
    "EngineBackend",
    "Runtime",
    "OpenAI",
    "UnsupportedPrimitive",
    "ChatTemplate",
    "get_chat_template",
    "greedy_token_selection",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "global_config",
    "SglFunction",
    "ForkedStates",
    "ProgramState",
]
