"""5 and 7: grammars built to explode fail their own request (400) while plain requests keep
their latency; the security properties of the HTTP server."""

from __future__ import annotations

import ast
import asyncio
import hmac
from pathlib import Path

import pytest

from benchmarks.stress import hostile

pytestmark = pytest.mark.slow

LANGRT = Path(__file__).resolve().parents[2] / "langrt"


def test_hostile_grammars_fail_alone(server):
    result = asyncio.run(hostile.run_hostile_grammars(server, baseline_s=3.0))
    grammars = result["grammars"]
    for name, outcome in grammars.items():
        if name == "stop_regex_backtracking":  # output forced to x's: must end, not hang the scheduler
            assert outcome["status"] == 200 and "stop_regex" in outcome["message"] and "abort" in outcome["message"], (
                outcome
            )
        else:
            assert outcome["status"] == 400, (name, outcome)
    assert "time limit of 2 s" in grammars["huge_schema_enum"]["message"], "a slow schema check is cut off at the limit"
    assert grammars["huge_schema_enum"]["seconds"] < 6
    assert "over the limit" in grammars["schema_past_size_limit"]["message"]
    assert result["healthy_after"]
    before, during = result["probe_latency_before_s"], result["probe_latency_during_s"]
    assert during["n"] >= 5, "plain requests were served throughout"
    # Generous: a 2-core CI box runs the grammar compiler beside the model.
    assert during["p50"] <= max(4 * before["p50"], before["p50"] + 0.3), (before, during)


def test_every_route_but_health_needs_the_key(server):
    result = hostile.run_security(server)
    assert len(result["routes"]) >= 13
    assert result["auth_failures"] == {}, "wrong, truncated, extended or missing keys must all be 401"
    assert 401 not in result["with_key_statuses"].values()
    chunked = result["oversized_statuses"].pop("/generate (chunked, no Content-Length)")
    assert set(result["oversized_statuses"].values()) == {413}
    assert chunked in (413, 0), "a chunked upload past the limit: 413, or the connection closed mid-upload"
    assert result["ipc_directory_mode"] == "0o700" and result["ipc_directory_owner_is_us"]
    assert result["listening_addresses"] == ["127.0.0.1"], "binds loopback unless told otherwise"
    for name, probe in result["file_probes"].items():
        assert 400 <= probe["status"] < 500 or probe["status"] == 200, (name, probe)
        assert not probe["leaked"], f"{name}: a file's content came back"
    assert not result["canary_created"], "a client-named path was written"


@pytest.mark.parametrize(
    "value", [b"Bearer \xff\xfe", b"Bearer stress-key\xc3\xa9", b"Bearer", b"bearer stress-key", b"Bearer  stress-key"]
)
def test_malformed_keys_are_401(server, value):
    """A key of bytes that are not UTF-8 was a 500 (UnicodeEncodeError in the auth check)."""
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + b"\r\nConnection: close\r\n\r\n"
        )
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 401 "), reply[:200]


def test_api_key_compare_is_constant_time(monkeypatch):
    """The auth middleware compares keys with hmac.compare_digest (no early exit on the first
    differing byte)."""
    from langrt.entrypoints import errors

    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(errors.hmac, "compare_digest", spy)
    check = errors.auth_middleware("secret")

    class Request:
        path = "/generate"
        headers = {"Authorization": "Bearer guess"}

    async def handler(request):
        raise AssertionError("a wrong key reached the handler")

    response = asyncio.run(check(Request(), handler))
    assert response.status == 401 and calls == [(b"Bearer guess", b"Bearer secret")]


def test_default_bind_is_loopback():
    from langrt.server_args import ServerArgs

    assert ServerArgs().host == "127.0.0.1"


def test_request_handlers_touch_no_files():
    """No HTTP handler module opens, reads, writes or deletes a path (so none can be named by a
    client): the only file the server reads, a --chat-template file, is named on the command line
    and read at start-up (entrypoints/chat_templates.py)."""
    banned = {
        "open",
        "read_text",
        "read_bytes",
        "write_text",
        "write_bytes",
        "unlink",
        "remove",
        "rmtree",
        "mkdir",
        "Path",
        "FileResponse",
        "add_static",
    }
    modules = [
        "entrypoints/http_server.py",
        "entrypoints/native_api.py",
        "entrypoints/openai_api.py",
        "entrypoints/openai_completions.py",
        "entrypoints/openai_common.py",
        "entrypoints/errors.py",
        "server/tokenizer_manager.py",
    ]
    found = []
    for module in modules:
        for node in ast.walk(ast.parse((LANGRT / module).read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in banned:
                    found.append(f"{module}:{node.lineno} {name}()")
    assert found == []
