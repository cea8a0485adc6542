"""Request mixes for the stress runs: plain, streaming and constrained requests over the native
and OpenAI routes, all with short outputs (max 8 new tokens) so a run's length is bounded by the
request count, not by what the model decides to say."""

from __future__ import annotations

import random

from benchmarks.stress.client import RequestSpec

WORDS = ("river mountain letter window garden engine market silver winter yellow number planet "
         "orange bridge doctor circle forest island kitchen ladder mirror pencil rocket shadow").split()  # fmt: skip

# (route, body fields, regex a stopped output must fully match). A handful of grammars, so the
# grammar cache serves repeats the way it does for real clients.
CONSTRAINED = [
    ("/generate", {"sampling_params": {"regex": "[0-9]{1,3}"}}, "[0-9]{1,3}"),
    ("/generate", {"sampling_params": {"choices": ["yes", "no", "maybe"]}}, "yes|no|maybe"),
    ("/v1/completions", {"regex": "(red|green|blue)"}, "red|green|blue"),
    (
        "/v1/chat/completions",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "flag", "schema": {
            "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}}}},
        r'\{"ok": ?(true|false)\}',
    ),
]  # fmt: skip


def prompt(rng: random.Random, words: int = 12) -> str:
    return f"Request {rng.randrange(10**6)}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def body_for(route: str, rng: random.Random, max_tokens: int, stream: bool) -> dict:
    """A plain request on `route` with `max_tokens` new tokens at most."""
    sampled = {"temperature": rng.choice([0.0, 0.7, 1.0])}
    if route == "/generate":
        body = {"text": prompt(rng), "sampling_params": {"max_new_tokens": max_tokens, **sampled}}
    elif route == "/v1/completions":
        body = {"model": "any", "prompt": prompt(rng), "max_tokens": max_tokens, **sampled}
    else:
        body = {
            "model": "any",
            "messages": [{"role": "user", "content": prompt(rng)}],
            "max_tokens": max_tokens,
            **sampled,
        }
        if stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    if stream:
        body["stream"] = True
    return body


def mixed(n: int, seed: int = 0, max_tokens: int = 8) -> list[RequestSpec]:
    """`n` requests: ~40% plain, ~30% streaming, ~30% constrained (some of those streamed), over
    /generate, /v1/completions and /v1/chat/completions; a few native batches and n=2 samples."""
    rng = random.Random(seed)
    routes = ["/generate", "/v1/completions", "/v1/chat/completions"]
    specs = []
    for _ in range(n):
        roll = rng.random()
        tokens = rng.randint(1, max_tokens)
        if roll < 0.4:
            route = rng.choice(routes)
            body = body_for(route, rng, tokens, stream=False)
            if route == "/generate" and rng.random() < 0.1:
                body["text"] = [body["text"], prompt(rng)]  # a batch of two
            elif route != "/generate" and rng.random() < 0.1:
                body["n"] = 2
            specs.append(RequestSpec(route, body, "plain"))
        elif roll < 0.7:
            route = rng.choice(routes)
            specs.append(RequestSpec(route, body_for(route, rng, tokens, stream=True), "stream"))
        else:
            route, extra, check = rng.choice(CONSTRAINED)
            body = body_for(route, rng, tokens, stream=rng.random() < 0.3)
            for key, value in extra.items():
                body[key] = {**body[key], **value} if key == "sampling_params" else value
            specs.append(RequestSpec(route, body, "constrained", check))
    return specs


def long_request(rng: random.Random, prompt_words: int, new_tokens: int, stream: bool = False) -> RequestSpec:
    """A /generate request that runs exactly `new_tokens` (ignore_eos), for KV pressure and
    disconnects."""
    body = {
        "text": prompt(rng, prompt_words),
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True},
        "stream": stream,
    }
    return RequestSpec("/generate", body, "stream" if stream else "plain")
