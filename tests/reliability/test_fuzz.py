"""4: hostile bodies for /generate and /v1/*: only 2xx/4xx, never a 5xx or a hang.

The hypothesis test sends 500+ drawn bodies one at a time; the regressions below are the bodies
that once got a 500 or killed the scheduler (each fixed in langrt/).
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings

from benchmarks.stress.fuzz import describe, request_bodies
from benchmarks.stress.hostile import fuzz_case_sync

pytestmark = pytest.mark.slow


@settings(max_examples=520, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=request_bodies())
def test_fuzzed_bodies_never_5xx(server, case):
    path, body = case
    status, problem = fuzz_case_sync(server, path, body, timeout_s=60)
    assert not problem and 200 <= status < 500, f"{path} -> {status}: {problem}\nbody: {describe(body)}"


def raw_post(server, path: str, raw: bytes):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", path, raw, {**server.headers, "Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def tokens(params: dict) -> dict:
    return {"text": "hi", "sampling_params": {"max_new_tokens": 1, **params}}


REGRESSIONS = [
    # (route, raw body, param named by the 400). Each was a 500, or took the scheduler down.
    (
        "/generate",
        json.dumps(tokens({"top_k": 10**30})).encode(),
        "top_k",
    ),  # int64 overflow in the sampler: scheduler died
    ("/generate", json.dumps(tokens({"stop_token_ids": [2**64]})).encode(), "stop_token_ids"),
    # past the vocabulary: with min_new_tokens, banning it indexed the logits out of bounds
    (
        "/generate",
        json.dumps(tokens({"stop_token_ids": [239211363778], "min_new_tokens": 1})).encode(),
        "stop_token_ids",
    ),
    ("/generate", json.dumps(tokens({"temperature": 10**400})).encode(), "temperature"),  # OverflowError in float()
    (
        "/generate",
        b'{"text": "hi", "sampling_params": {"top_k": ' + b"9" * 5000 + b"}}",
        None,
    ),  # past the 4300-digit int limit
    ("/generate", b"\xff\xfe{}", None),  # not UTF-8
    ("/generate", b"[" * 100_000 + b"]" * 100_000, None),  # RecursionError in json
    (
        "/generate",
        b'{"text": ' + b"[" * 70 + b'"x"' + b"]" * 70 + b"}",
        None,
    ),  # under json's limit, past the depth limit
    ("/generate", json.dumps({"text": "a \ud800 b"}).encode(), "text"),  # lone surrogate: TypeError in the tokenizer
    ("/v1/completions", json.dumps({"prompt": "\udfff", "max_tokens": 1}).encode(), "prompt"),
    (
        "/v1/chat/completions",
        json.dumps({"messages": [{"role": "user", "content": "\ud83d"}], "max_tokens": 1}).encode(),
        "messages",
    ),
    (
        "/generate",
        json.dumps(tokens({"json_schema": "[" * 5000 + "]" * 5000})).encode(),
        "json_schema",
    ),  # RecursionError
    (
        "/generate",
        json.dumps(tokens({"n": 10**9})).encode(),
        "n",
    ),  # was expanded into 10**9 requests before the capacity check
    # Accepted, and then cost every request: 300 positions x 49152 top logprobs took 57 s and
    # 11 GB; 20k stop regexes took 0.8 s per token of the scheduler's loop.
    (
        "/generate",
        json.dumps({**tokens({}), "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 49152}).encode(),
        "top_logprobs_num",
    ),
    ("/generate", json.dumps(tokens({"stop_regex": [f"z{i}" for i in range(20_000)]})).encode(), "stop_regex"),
    ("/generate", json.dumps(tokens({"stop": [f"z{i}" for i in range(600_000)]})).encode(), "stop"),
    ("/generate", json.dumps(tokens({"stop_token_ids": list(range(600_000))})).encode(), "stop_token_ids"),
]


@pytest.mark.parametrize("path, raw, param", REGRESSIONS, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(REGRESSIONS)])
def test_once_fatal_bodies_are_400(server, path, raw, param):
    status, payload = raw_post(server, path, raw)
    assert status == 400, payload
    assert payload["error"]["code"] == 400 and payload["error"]["param"] == param, payload
    assert server.get("/health")[0] == 200, "the server keeps serving"


def test_huge_n_is_refused_at_once(server):
    """A request for more sequences than the server ever holds is a 400 naming n (not a 503
    that no retry could serve), decided before any per-sequence work."""
    status, payload = server.post("/generate", tokens({"n": 40}))
    assert status == 400 and payload["error"]["param"] == "n" and "at most" in payload["error"]["message"]


OVERSIZED = [
    # (route, body, param): each took the event loop for a minute (tokenizing) before its 400.
    ("/generate", {"text": ["a"] * 2_500_000}, "text"),
    ("/v1/completions", {"prompt": ["a"] * 2_500_000, "max_tokens": 1}, "prompt"),
    ("/generate", {"text": "hello world, " * 900_000}, "text"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 100_000, "max_tokens": 1}, "messages"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hello world, " * 900_000}], "max_tokens": 1},
        "messages",
    ),
]


@pytest.mark.parametrize("path, body, param", OVERSIZED, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(OVERSIZED)])
def test_oversized_prompts_are_refused_before_tokenizing(server, path, body, param):
    start = time.monotonic()
    status, payload = raw_post(server, path, json.dumps(body).encode())
    assert status == 400 and payload["error"]["param"] == param, payload
    assert time.monotonic() - start < 10


def test_float32_underflow_in_sampling_values_is_harmless(server):
    """A temperature that is 0 in float32 (2.6e-122) with top_p killed the scheduler (NaN
    probabilities -> an index of -1 in the top-p filter); so did a repetition penalty of 1e-300.
    Such a temperature is greedy now, and the penalty is floored."""
    body = {"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "sampling_params": {"max_new_tokens": 3}}
    greedy = server.post("/generate", {**body, "sampling_params": {"max_new_tokens": 3, "temperature": 0}})[1]
    for params in ({"temperature": 2.6e-122, "top_p": 0.2}, {"temperature": 1e-40, "top_k": 5}):
        status, out = server.post("/generate", {**body, "sampling_params": {"max_new_tokens": 3, **params}})
        assert status == 200 and out["output_ids"] == greedy["output_ids"], (params, out)
    status, _ = server.post(
        "/generate", {**body, "sampling_params": {"max_new_tokens": 3, "repetition_penalty": 1e-300, "top_p": 0.5}}
    )
    assert status == 200 and server.get("/health")[0] == 200
