"""Embeddings over HTTP: OpenAI's /v1/embeddings and SGLang's native /encode (docs/embeddings.md).
Both need a server started with --is-embedding; anything else they are asked is a 400."""

from __future__ import annotations

import base64

import numpy as np
from aiohttp import web

from langrt.embeddings.api import create_embeddings
from langrt.entrypoints.native_api import read_json
from langrt.errors import InvalidRequest

_OPENAI_FIELDS = {"input", "model", "encoding_format", "dimensions", "user"}
ENCODING_FORMATS = ("float", "base64")


async def openai_embeddings(request: web.Request) -> web.Response:
    body = await read_json(request, _OPENAI_FIELDS)
    if "input" not in body:
        raise InvalidRequest("input is required: a string, a list of strings, or token ids", "input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODING_FORMATS:
        raise InvalidRequest(
            f"encoding_format must be one of {', '.join(ENCODING_FORMATS)}; got {encoding!r}", "encoding_format"
        )
    result = await create_embeddings(request.app["manager"], body["input"], body.get("dimensions"))
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(v, encoding)} for i, v in enumerate(result.vectors)
    ]
    tokens = result.total_prompt_tokens
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "model": request.app["served_model_name"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _encode(vector: np.ndarray, encoding: str):
    """float: a JSON list; base64: the little-endian float32 bytes, as OpenAI sends them."""
    if encoding == "float":
        return vector.tolist()
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")


async def encode(request: web.Request) -> web.Response:
    """SGLang's /encode: {"text": str | [str]} or {"input_ids": ids | [ids]} -> {"embedding",
    "meta_info"} per input (a list for a list)."""
    body = await read_json(request, {"text", "input_ids", "dimensions", "rid"})
    if ("text" in body) == ("input_ids" in body):
        raise InvalidRequest("give exactly one of text and input_ids", "text")
    raw = body.get("text", body.get("input_ids"))
    result = await create_embeddings(request.app["manager"], raw, body.get("dimensions"))
    out = [
        {"embedding": v.tolist(), "meta_info": {"prompt_tokens": n, "cached_tokens": c}}
        for v, n, c in zip(result.vectors, result.prompt_tokens, result.cached_tokens)
    ]
    single = isinstance(raw, str) or bool(raw) and all(isinstance(t, int) for t in raw)
    return web.json_response(out[0] if single else out)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/embeddings", openai_embeddings)
    app.router.add_post("/encode", encode)
