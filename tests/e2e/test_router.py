"""`langrt router` over two `langrt launch` workers on the built-in model: both APIs (streaming
too) through it, cache-aware stickiness, add/remove at run time, and a killed worker's requests
retried on the other with none lost."""

from __future__ import annotations

import concurrent.futures
import signal
import time

import pytest

from server_utils import LaunchedRouter, LaunchedServer

pytestmark = pytest.mark.slow

WORKER_FLAGS = ("--max-total-tokens", "8192", "--num-threads", "1")


@pytest.fixture(scope="module")
def cluster():
    workers = [LaunchedServer(*WORKER_FLAGS) for _ in range(2)]
    router = LaunchedRouter("--worker-urls", *(w.url for w in workers), "--health-check-interval", "0.5")
    yield router, workers
    assert router.stop() == 0, "SIGTERM ends the router cleanly"
    for w in workers:
        w.stop()


def _sent(router) -> dict[str, int]:
    return {w["url"]: w["sent"] for w in router.get("/list_workers")[1]["workers"]}


def test_both_apis_through_the_router(cluster):
    router, _ = cluster
    out = router.post(
        "/generate", {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    )[1]
    assert "Paris" in out["text"] and out["meta_info"]["completion_tokens"] == 6
    chat = router.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 24,
            "temperature": 0,
        },
    )[1]
    assert "Paris" in chat["choices"][0]["message"]["content"]
    comp = router.post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0})[1]
    assert comp["choices"][0]["text"] == out["text"]
    events = router.stream(
        "/generate",
        {
            "text": "The capital of France is",
            "sampling_params": {"max_new_tokens": 6, "temperature": 0},
            "stream": True,
        },
    )
    assert events[-1] == "[DONE]" and events[-2]["text"] == out["text"] and len(events) > 2
    chunks = router.stream(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 24,
            "temperature": 0,
            "stream": True,
        },
    )
    assert chunks[-1] == "[DONE]"
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c["choices"])
        == chat["choices"][0]["message"]["content"]
    )
    assert router.get("/v1/models")[1]["data"][0]["id"] == "SmolLM2-135M-Instruct"
    assert router.post("/generate", {"text": "x", "sampling_params": {"temperature": -1}}, check=False)[0] == 400
    info = router.get("/get_server_info")[1]
    assert len(info["workers"]) == 2 and info["kv_total_tokens"] == sum(
        w["server_info"]["kv_total_tokens"] for w in info["workers"]
    )


def test_cache_aware_sends_a_prefix_to_one_worker(cluster):
    router, _ = cluster
    preambles = [f"Tenant {t} rules: " + f"answer tersely about topic {t}. " * 30 for t in range(2)]
    before = _sent(router)
    owners = {0: set(), 1: set()}
    for i in range(6):
        t = i % 2
        out = router.post("/generate", {"text": preambles[t] + f"Q{i}:", "sampling_params": {"max_new_tokens": 2}})[1]
        after = _sent(router)
        owners[t] |= {url for url in after if after[url] != before.get(url, 0)}
        before = after
        if i >= 2:
            assert out["meta_info"]["cached_tokens"] > 100, "the worker that has the preamble got it again"
    assert len(owners[0]) == 1 and len(owners[1]) == 1


def test_remove_and_add_worker(cluster):
    router, workers = cluster
    gone = workers[1].url
    assert router.post(f"/remove_worker?url={gone}", None)[1] == {"removed": gone}
    assert router.post(f"/remove_worker?url={gone}", None, check=False)[0] == 404
    before = _sent(router)
    for i in range(4):
        router.post("/generate", {"text": f"fresh prompt {i} " * 40, "sampling_params": {"max_new_tokens": 1}})
    assert gone not in _sent(router) and _sent(router)[workers[0].url] == before[workers[0].url] + 4
    assert router.post(f"/add_worker?url={gone}", None)[1] == {"added": gone, "healthy": True}
    assert router.post(f"/add_worker?url={gone}", None, check=False)[0] == 400
    sent = _sent(router)
    for i in range(4):
        router.post("/generate", {"text": f"another new prompt {i} " * 40, "sampling_params": {"max_new_tokens": 1}})
    assert _sent(router)[gone] > sent[gone], "the added worker gets new prefixes"


def test_a_killed_worker_loses_no_request(cluster):
    router, workers = cluster
    body = lambda i: {
        "text": f"Count slowly, request {i}:",
        "sampling_params": {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True},
    }
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(router.post, "/generate", body(i), check=False, timeout=120) for i in range(8)]
        deadline = time.monotonic() + 30
        while True:  # kill once the requests are at the workers (the router counts them until answered)
            busy = {w["url"]: w["in_flight"] for w in router.get("/list_workers")[1]["workers"]}
            if sum(busy.values()) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        victim = max(workers, key=lambda w: busy[w.url])
        assert busy[victim.url] > 0
        victim.process.send_signal(signal.SIGKILL)
        results = [f.result() for f in futures]
    assert [status for status, _ in results] == [200] * 8, results
    assert all(r["meta_info"]["completion_tokens"] == 48 for _, r in results)
    listed = router.get("/list_workers")[1]
    assert listed["retries"] >= 1
    assert [w["healthy"] for w in listed["workers"] if w["url"] == victim.url] == [False]
    assert router.get("/health")[0] == 200


def test_dp_size_two_replicas_behind_one_port():
    server = LaunchedServer("--dp-size", "2", "--max-total-tokens", "4096")
    try:
        urls = server.get("/list_workers")[1]["urls"]
        assert len(urls) == 2 and server.url not in urls
        preamble = "You are a terse assistant for a bakery. " * 12
        outs = [
            server.post("/generate", {"text": preamble + f"Q{i}:", "sampling_params": {"max_new_tokens": 3}})[1]
            for i in range(3)
        ]
        assert outs[2]["meta_info"]["cached_tokens"] > 80, "one replica got the shared preamble each time"
        chunks = server.stream(
            "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "stream": True}
        )
        assert chunks[-1] == "[DONE]" and "Paris" in "".join(c["choices"][0]["text"] for c in chunks[:-1])
        info = server.get("/get_server_info")[1]
        assert [w["url"] for w in info["workers"]] == urls and info["kv_total_tokens"] >= 2 * 4096 - 2
        each = [w["server_info"] for w in info["workers"]]
        assert info["dp_size"] == 2 and info["prompt_tokens"] == sum(e["prompt_tokens"] for e in each)
        assert info["cache_hit_rate"] == pytest.approx(
            sum(e["cached_prompt_tokens"] for e in each) / info["prompt_tokens"]
        )
    finally:
        assert server.stop() == 0, "SIGTERM ends the launch cleanly"
    for url in urls:
        assert _down(url), f"replica {url} outlived the launch"


def test_dp_size_with_tp_size_serves_replicas_of_ranks(tiny_llama_dir):
    """--dp-size 2 --tp-size 2: two replicas, each a scheduler and a tensor-parallel worker."""
    flags = ["--model-path", str(tiny_llama_dir), "--dtype", "float32", "--max-total-tokens", "4096"]
    server = LaunchedServer("--dp-size", "2", "--tp-size", "2", *flags)
    try:
        infos = [w["server_info"] for w in server.get("/get_server_info")[1]["workers"]]
        assert [(i["tp_size"], len(i["processes"]["tp_workers"]), i["num_threads"]) for i in infos] == [(2, 1, 1)] * 2
        body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        outs = [server.post("/generate", body)[1] for _ in range(2)]
        assert outs[0]["output_ids"] == outs[1]["output_ids"] and len(outs[0]["output_ids"]) == 8
    finally:
        assert server.stop() == 0, "SIGTERM ends the launch cleanly"


def _down(url: str) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(url + "/health", timeout=2)
    except OSError:
        return True
    return False
