"""/concate_and_append_request answers 501 with what to do instead: it used to answer success
without joining anything, so a client believed KV had been joined that never was."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from langrt.entrypoints import native_api


async def post(path: str, body: dict) -> tuple[int, dict]:
    app = web.Application()
    app.router.add_post("/concate_and_append_request", native_api.concate_and_append_request)
    async with TestClient(TestServer(app)) as client:
        response = await client.post(path, json=body)
        return response.status, json.loads(await response.text())


def test_concate_and_append_answers_501_naming_the_text_path():
    status, body = asyncio.run(post("/concate_and_append_request", {"src_rids": ["a", "b"], "dst_rid": "c"}))
    assert status == 501
    assert body["error"]["code"] == 501
    message = body["error"]["message"]
    assert "not implemented" in message and "enable_parallel_encoding = False" in message
    assert "success" not in body
