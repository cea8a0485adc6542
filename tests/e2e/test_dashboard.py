"""The live dashboard (issue 28) against `langrt launch` on the built-in model: the state
endpoint, its SSE stream, SGLang's metric names on /metrics, and the page in headless
Chromium during a few-shot workload (skipped where no Chromium is installed)."""

from __future__ import annotations

import json
import re
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from headless_chromium import HeadlessChromium, find_chromium
from server_utils import LaunchedServer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GRAFANA = ROOT / "deploy" / "grafana" / "langrt-dashboard.json"


@pytest.fixture(scope="module")
def server():
    # One torch thread (see e2e/conftest.py); a small pool, so the tree stays small.
    s = LaunchedServer("--max-total-tokens", "16384", "--num-threads", "1")
    yield s
    assert s.stop() == 0


def few_shot_prompts(n: int, question: str = "Sentiment:") -> list[str]:
    sys.path.insert(0, str(EXAMPLES))
    from few_shot_classification import EXAMPLES as SHOTS, REVIEWS

    preamble = "Classify the sentiment of each movie review.\n\n" + "".join(
        f"Review: {t}\nSentiment: {l}\n\n" for t, l in SHOTS
    )
    return [f"{preamble}Review: {review}\n{question}" for review, _ in REVIEWS[:n]]


def test_state_shows_the_shared_few_shot_prefix_as_hit(server):
    server.post("/flush_cache", {})
    server.post("/generate", {"text": few_shot_prompts(4), "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    _, state = server.get("/dashboard/state")
    nodes = state["tree"]["nodes"]
    ids = {n["id"] for n in nodes}
    assert all(n["parent"] is None or n["parent"] in ids for n in nodes), "a connected tree, parents first"
    shared = [n for n in nodes if n["children"] >= 2]
    assert shared, "the preamble branches into the reviews"
    top = max(shared, key=lambda n: n["tokens"])
    assert top["label"].startswith("Classify the sentiment"), top["label"]
    assert top["hits"] >= 3 and top["hit_age"] < 30, "three of the four prompts reused the preamble"
    assert state["counters"]["cache_hit_rate"] > 0.5
    assert state["num_running"] == 0 and state["running"] == []
    s = state["scheduler"]
    assert s["steps"] > 0 and 0 < s["snapshot_s"] < s["busy_s"]
    assert len(state["series"]) >= 1 and "ttft_p99" in state["series"][-1]


def test_events_stream_states(server):
    with urllib.request.urlopen(server.url + "/dashboard/events?interval=0.25", timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        seqs = []
        for line in resp:
            if line.startswith(b"data: "):
                seqs.append(json.loads(line[6:])["seq"])
                if len(seqs) == 2:
                    break
    assert seqs[1] > seqs[0]
    status, body = server.get("/dashboard/events?interval=0", check=False)
    assert status == 400 and body["error"]["param"] == "interval"


def test_metrics_have_sglang_names(server):
    server.post("/generate", {"text": few_shot_prompts(2), "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    _, text = server.get("/metrics")
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
                 "sglang:gen_throughput", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:time_per_output_token_seconds_count",
                 "sglang:e2e_request_latency_seconds_sum", "langrt_retractions"):  # fmt: skip
        assert f"\n{name}" in text, name
    hit_rate = next(line for line in text.splitlines() if line.startswith("sglang:cache_hit_rate{"))
    assert hit_rate.startswith('sglang:cache_hit_rate{model_name="SmolLM2-135M-Instruct"} ')
    assert 0 < float(hit_rate.split()[-1]) <= 1


def test_grafana_dashboard_queries_metrics_the_server_has(server):
    """Every series deploy/grafana's panels query is on /metrics (histograms by their _bucket)."""
    server.post("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}})  # per-reason counters exist
    _, text = server.get("/metrics")
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    panels = json.loads(GRAFANA.read_text())["panels"]
    queried = {
        name
        for p in panels
        for t in p["targets"]
        for name in re.findall(r"\b(?:sglang:|langrt_)[a-z0-9_:]+", t["expr"])
    }
    assert len(panels) >= 8 and len(queried) >= 10
    assert sorted(queried - exported) == []


def test_page_in_headless_chromium(server, tmp_path):
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; or set CHROMIUM=/path/to/chrome)")
    work = threading.Thread(
        target=server.post,
        args=(
            "/generate",
            {"text": few_shot_prompts(4, "Why?"), "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}},
        ),
        kwargs={"timeout": 300},
    )
    browser = HeadlessChromium(binary, tmp_path / "profile")
    try:
        browser.navigate(server.url + "/dashboard")
        browser.wait_for("Number(document.body.dataset.seq) > 0")  # live before the workload starts
        work.start()
        browser.wait_for("document.querySelectorAll('#tree g.node').length > 0")
        rows = browser.wait_for("document.querySelectorAll('#batch tbody tr').length")
        assert rows >= 1
        assert browser.evaluate("document.querySelector('#batch tbody tr td.prompt').textContent").startswith(
            "Classify"
        )
        browser.screenshot(tmp_path / "dashboard_running.png")
        work.join()
        _, state = server.get("/dashboard/state")  # idle now: the tree no longer changes
        browser.wait_for(f"Number(document.body.dataset.seq) >= {state['seq']}")
        assert browser.evaluate("document.querySelectorAll('#tree g.node').length") == len(state["tree"]["nodes"])
        shared = [
            n for n in state["tree"]["nodes"] if n["children"] >= 2 and n["hit_age"] is not None and n["hit_age"] < 30
        ]
        assert shared, "the few-shot preamble is shared and was hit"
        classes = browser.evaluate(
            f"document.querySelector('#tree g.node[data-id=\"{shared[0]['id']}\"]').getAttribute('class')"
        )
        assert "hit" in classes.split()
        assert (tmp_path / "dashboard_running.png").stat().st_size > 10_000
        browser.screenshot(tmp_path / "dashboard_idle.png")
    finally:
        browser.close()
        if work.is_alive():
            work.join()
