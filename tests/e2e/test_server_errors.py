"""Every error class of the HTTP server, while it keeps serving; disconnects; a dead child."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time

import pytest

from server_utils import LaunchedServer

AUTH = {"Authorization": "Bearer secret"}


@pytest.fixture(scope="module")
def guarded(tiny_llama_dir):
    s = LaunchedServer(
        "--model-path", str(tiny_llama_dir), "--api-key", "secret", "--max-request-bytes", "20000",
        "--max-total-tokens", "8192", "--max-running-requests", "2", "--max-queued-requests", "1",
        "--context-length", "2048", "--dtype", "float32", "--body-read-timeout", "1",
    )  # fmt: skip
    yield s
    s.stop()


def long_body(n: int = 1200) -> dict:
    return {"text": "Hello there", "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}


class Background(threading.Thread):
    """A long streaming request that must finish untouched by what happens meanwhile."""

    def __init__(self, server: LaunchedServer, n: int = 1200):
        super().__init__(daemon=True)
        self.server, self.n, self.events = server, n, None
        self.start()

    def run(self):
        self.events = self.server.stream("/generate", {**long_body(self.n), "stream": True}, headers=AUTH)

    def check(self):
        self.join(120)
        final = self.events[-2]
        assert self.events[-1] == "[DONE]"
        assert final["meta_info"]["completion_tokens"] == self.n
        assert final["meta_info"]["finish_reason"] == {"type": "length", "length": self.n}


def wait_running(server, at_least: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.get("/get_server_info", headers=AUTH)[1]["in_flight_requests"] >= at_least:
            return
        time.sleep(0.05)
    raise TimeoutError("requests did not start")


BAD_REQUESTS = [
    ({"text": "hi", "sampling_params": {"temprature": 1}}, "temprature"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"text": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
    ({"text": "hi", "sampling_params": {"n": 0}}, "n"),
    ({"text": "hi", "sampling_params": {"regex": "a+", "json_schema": "{}"}}, "json_schema"),
    ({"text": "hi", "sampling_params": {"regex": "(unclosed"}}, "regex"),
    (
        {
            "text": "hi",
            "sampling_params": {"json_schema": '{"type": "array", "items": {"type": "string"}, "uniqueItems": true}'},
        },
        "uniqueItems",
    ),
    ({"text": "hi", "sampling_params": {"json_schema": '{"not": {"pattern": "^a"}}'}}, "not"),
    ({"text": "hi", "sampling_params": {"json_schema": "{bad"}}, "json_schema"),
    ({"text": "hi", "extra": 1}, "extra"),
    ({"text": ""}, "text"),
    ({"text": "hi", "input_ids": [1]}, "text"),
    ({"input_ids": [1] * 2100}, "prompt"),
    ({"input_ids": [1] * 1000, "sampling_params": {"max_new_tokens": 1500}}, "max_new_tokens"),
    ({"input_ids": [1, 2, 10**9]}, "input_ids"),
    ({"text": "hi", "return_logprob": "yes"}, "return_logprob"),
]


def test_errors_while_serving(guarded):
    background = Background(guarded)
    wait_running(guarded, 1)
    for body, param in BAD_REQUESTS:
        status, payload = guarded.post("/generate", body, headers=AUTH, check=False)
        assert status == 400, (body, payload)
        assert payload["error"]["param"] == param and payload["error"]["type"] == "invalid_request_error"
        assert param in payload["error"]["message"], payload
    status, payload = guarded.post(
        "/generate", {"text": "hi", "sampling_params": {"regex": "ab(c"}}, headers=AUTH, check=False
    )
    assert status == 400 and "position" in payload["error"]["message"], payload
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    bad_format = {
        **chat,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"if": {"pattern": "^a"}, "then": {"minLength": 2}}},
        },
    }
    status, payload = guarded.post("/v1/chat/completions", bad_format, headers=AUTH, check=False)
    assert status == 400 and payload["error"]["param"] == "if", payload
    status, payload = guarded.post("/generate", b"{not json", headers=AUTH, check=False)
    assert status == 400 and "JSON" in payload["error"]["message"]
    assert guarded.post("/generate", {"text": "hi"}, check=False)[0] == 401
    assert guarded.post("/generate", {"text": "hi"}, headers={"Authorization": "Bearer wrong"}, check=False)[0] == 401
    assert guarded.get("/v1/models", check=False)[0] == 401
    assert guarded.get("/health")[0] == 200, "/health needs no key"
    status, payload = guarded.post("/generate", {"text": "x" * 30000}, headers=AUTH, check=False)
    assert status == 413 and payload["error"]["code"] == 413
    assert guarded.get("/no/such/route", headers=AUTH, check=False)[0] == 404
    status, payload = guarded.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "tools": []},
        headers=AUTH,
        check=False,
    )
    assert status == 400 and payload["error"]["param"] == "tools"
    background.check()


def test_stalled_body_gets_408_and_the_server_goes_on(guarded):
    """A client that sends its headers and part of its body, then stalls (slow-loris), is
    answered 408 once --body-read-timeout (1 s here) has passed; others are served meanwhile."""
    sock = socket.create_connection(("127.0.0.1", guarded.port), timeout=10)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\": ")  # fmt: skip
    started = time.monotonic()
    assert guarded.post("/generate", long_body(3), headers=AUTH)[0] == 200
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(4096)
        assert chunk, f"closed without an answer: {reply!r}"
        reply += chunk
    waited = time.monotonic() - started
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert 0.9 <= waited < 5, waited


def test_full_queue_is_503_then_served(guarded):
    backgrounds = [Background(guarded, 800), Background(guarded, 800)]
    wait_running(guarded, 3 - 1)
    time.sleep(0.2)
    # Capacity: 2 running + 1 queued. One more fits, the next is refused.
    extra = Background(guarded, 50)
    wait_running(guarded, 3)
    status, payload = guarded.post("/generate", long_body(5), headers=AUTH, check=False)
    assert status == 503 and "overloaded" in payload["error"]["message"]
    assert guarded.last_headers.get("Retry-After") == "1", "an overloaded 503 says when to retry"
    for b in backgrounds:
        b.check()
    extra.check()
    status, _ = guarded.post("/generate", long_body(5), headers=AUTH)
    assert status == 200, "a retry is served"


def test_client_disconnect_frees_everything(guarded):
    conn = http.client.HTTPConnection("127.0.0.1", guarded.port, timeout=30)
    conn.request(
        "POST",
        "/generate",
        json.dumps({**long_body(1500), "stream": True}),
        {**AUTH, "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    assert response.status == 200
    for _ in range(3):
        response.readline()
    conn.sock.close()  # the client goes away mid-stream
    conn.close()
    deadline = time.monotonic() + 30
    while True:
        info = guarded.get("/get_server_info", headers=AUTH)[1]
        if info["running_requests"] == info["waiting_requests"] == info["in_flight_requests"] == 0:
            break
        assert time.monotonic() < deadline, "the abandoned request kept running"
        time.sleep(0.1)
    assert info["kv_available_tokens"] == info["kv_total_tokens"], "a KV slot leaked"
    assert guarded.post("/generate", long_body(3), headers=AUTH)[0] == 200


def test_dead_scheduler_means_503_and_exit(tiny_llama_dir):
    server = LaunchedServer("--model-path", str(tiny_llama_dir), "--max-total-tokens", "4096", "--dtype", "float32")
    pids = server.get("/get_server_info")[1]["processes"]
    ipc = pids["ipc_directory"]
    assert os.stat(ipc).st_mode & 0o777 == 0o700, "the ipc directory is private"
    os.kill(pids["scheduler"], signal.SIGKILL)
    killed = time.monotonic()
    statuses = set()
    while server.process.poll() is None and time.monotonic() - killed < 10:
        statuses.add(server.get("/health", check=False)[0])
        time.sleep(0.05)
    assert server.process.poll() is not None and server.process.returncode != 0
    assert time.monotonic() - killed < 5, "the server exits within 5 s"
    assert 503 in statuses
    assert not os.path.exists(ipc), "the ipc files are removed"


def test_health_generate_needs_a_scheduler_that_makes_progress(tiny_llama_dir):
    """/health only says the processes live; /health_generate runs a one-token probe when
    nothing was generated lately, so a stuck (here: stopped) scheduler fails it."""
    server = LaunchedServer("--model-path", str(tiny_llama_dir), "--max-total-tokens", "4096", "--dtype", "float32")
    try:
        passes = server.get("/get_server_info")[1]["forward_passes"]
        assert server.get("/health_generate")[0] == 200
        assert server.get("/get_server_info")[1]["forward_passes"] > passes, "an idle server generated to answer"
        scheduler = server.get("/get_server_info")[1]["processes"]["scheduler"]
        time.sleep(5.5)  # past the window in which recent output counts as progress
        os.kill(scheduler, signal.SIGSTOP)
        try:
            assert server.get("/health")[0] == 200
            started = time.monotonic()
            status, payload = server.get("/health_generate", check=False, timeout=30)
            assert status == 503 and "progress" in payload["error"]["message"], payload
            assert 9 <= time.monotonic() - started < 15
        finally:
            os.kill(scheduler, signal.SIGCONT)
        assert server.get("/health_generate", timeout=30)[0] == 200
    finally:
        server.stop()


def test_response_format_constrains_chat_output(guarded):
    import jsonschema

    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 12}, "score": {"type": "integer", "minimum": 0,
              "maximum": 9}}, "required": ["answer", "score"], "additionalProperties": False}  # fmt: skip
    formats = [
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}, schema),
        ({"type": "json_object"}, {"type": "object"}),
    ]
    for response_format, expected in formats:
        body = {"messages": [{"role": "user", "content": "Reply in JSON"}], "max_tokens": 80, "temperature": 1.0, "seed": 3,
                "n": 3, "response_format": response_format}  # fmt: skip
        status, payload = guarded.post("/v1/chat/completions", body, headers=AUTH)
        for choice in payload["choices"]:
            if choice["finish_reason"] == "stop":
                jsonschema.validate(json.loads(choice["message"]["content"]), expected)
            else:
                assert choice["finish_reason"] == "length"
    strict = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "response_format": strict,
        "json_schema_options": ["any_order"],
    }
    status, payload = guarded.post("/v1/chat/completions", body, headers=AUTH, check=False)
    assert (
        status == 400
        and payload["error"]["param"] == "response_format"
        and "strict true" in payload["error"]["message"]
    )
    # continuing a final message needs one of the assistant's
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "continue_final_message": True}
    status, payload = guarded.post("/v1/chat/completions", body, headers=AUTH, check=False)
    assert status == 400 and payload["error"]["param"] == "continue_final_message"
