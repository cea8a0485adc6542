"""The side-by-side CPU benchmarks' own arithmetic, without running an engine: a model's bytes per
decode step and FLOPs (benchmarks/model_cost.py), a worker's decode timing, a process tree's
memory (benchmarks/machine_limits.py), and bench_serving's chat workload. A few seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for folder in (ROOT / "benchmarks", ROOT / "tests"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bench_serving import CHAT_USER_WORDS, SYSTEM_PROMPTS, make_prompts  # noqa: E402
from machine_limits import tree_memory  # noqa: E402
from model_cost import model_cost  # noqa: E402
from peers.worker import decode  # noqa: E402


@pytest.mark.parametrize("tied", [True, False])
def test_model_cost_counts_what_a_decode_step_reads(tmp_path, tied):
    from transformers import LlamaConfig, LlamaForCausalLM
    from tiny_arch import write_tiny_checkpoint

    model = write_tiny_checkpoint(LlamaConfig, LlamaForCausalLM, tmp_path, tie_word_embeddings=tied)
    params = dict(model.named_parameters())  # a tied head is the embedding, listed once
    embed = params["model.embed_tokens.weight"]
    cost = model_cost(tmp_path)
    every_byte = sum(p.numel() * p.element_size() for p in params.values())
    # an untied embedding is read one row per token; tied, it is the LM head and read whole
    assert cost.bytes_per_step == every_byte - (0 if tied else embed.numel() * embed.element_size())
    matrices = sum(
        p.numel() for name, p in params.items() if p.dim() == 2 and (tied or name != "model.embed_tokens.weight")
    )
    assert cost.matmul_params == matrices
    assert (cost.num_layers, cost.q_size, cost.kv_size) == (2, 64, 32)


def test_prompt_flops_adds_causal_attention_to_the_matrices(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    from tiny_arch import write_tiny_checkpoint

    write_tiny_checkpoint(LlamaConfig, LlamaForCausalLM, tmp_path)
    cost = model_cost(tmp_path)
    # one token attends to itself: QK^T and PV, 2 flops each, per layer and query channel
    assert cost.prompt_flops(1) == cost.flops_per_token + 4 * 2 * 64
    # ten tokens attend to 1 + 2 + ... + 10 positions
    assert cost.prompt_flops(10) == 10 * cost.flops_per_token + 4 * 2 * 64 * 55
    assert cost.kv_bytes(100, 2) == 2 * 2 * 32 * 100 * 2


class PacedSide:
    """An engine stand-in on a fake clock: a prompt of `first` seconds, then one token per `gap`."""

    def __init__(self, first: float, gap: float):
        self.first, self.gap, self.flushed, self.now = first, gap, 0, 100.0

    def clock(self) -> float:
        return self.now

    def flush(self) -> None:
        self.flushed += 1

    def stream(self, ids, new_tokens):
        self.now += self.first
        out = []
        for i in range(new_tokens):
            self.now += self.gap if i else 0.0
            out.append(i)
            yield list(out)


def test_decode_times_the_tokens_after_the_first_and_flushes_first(monkeypatch):
    side = PacedSide(first=0.5, gap=0.025)
    monkeypatch.setattr(time, "perf_counter", side.clock)
    row = decode(side, [1, 2, 3], new_tokens=6)
    assert side.flushed == 1 and row["tokens"] == 6 and row["output_ids"] == list(range(6))
    assert row["ttft_s"] == pytest.approx(0.5) and row["e2e_s"] == pytest.approx(0.625)
    # 5 tokens after the first, 0.025 s apart: the prompt's 0.5 s is not in the rate
    assert row["decode_tok_s"] == pytest.approx(40.0)


def test_tree_memory_sums_a_process_and_its_children():
    holder = "import time; x = bytearray(64 << 20); print('held', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"  # its 64 MiB are written (so resident) by now
        alone = tree_memory(child.pid)
        both = tree_memory(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert alone["processes"] == 1 and alone["rss_bytes"] >= 64 << 20
    assert both["processes"] >= 2 and both["rss_bytes"] > alone["rss_bytes"]
    assert 0 < both["pss_bytes"] <= both["rss_bytes"]


def test_chat_workload_shares_system_prompts_and_mixes_user_lengths():
    conversations = make_prompts(24, 0, seed=3, workload="chat")
    systems = {c[0]["content"] for c in conversations}
    assert len(systems) == SYSTEM_PROMPTS and all(c[0]["role"] == "system" for c in conversations)
    user_words = {len(c[1]["content"].split()) - 3 for c in conversations}  # less "Request i. Summarize:"
    assert len(user_words) > 1 and user_words <= set(CHAT_USER_WORDS)
    assert make_prompts(24, 0, seed=3, workload="chat") == conversations  # seeded


FAKE_SERVER = """#!{python}
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
assert sys.argv[sys.argv.index("--parallel") + 1] == "4" and "--cont-batching" in sys.argv

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_server_process_waits_for_health_and_stops_the_server(tmp_path):
    import socket

    from peers.servers import ServerProcess, ServerSpec

    fake = tmp_path / "llama-server"
    fake.write_text(FAKE_SERVER.format(python=sys.executable))
    fake.chmod(0o755)
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = ServerSpec("llama-server", "model.gguf", port, threads=2, ctx=4096, parallel=4, llama_server_bin=str(fake))
    server = ServerProcess(spec, timeout_s=60)
    try:
        assert server.start_to_health_s > 0 and server.memory()["processes"] >= 1
        assert server.proc.poll() is None
    finally:
        server.stop()
    assert server.proc.poll() is not None  # stopped, its whole process group signalled


def test_a_server_that_exits_at_start_is_reported_with_its_log(tmp_path):
    from peers.servers import ServerProcess, ServerSpec

    fake = tmp_path / "llama-server"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('error: unknown model file', flush=True)\nsys.exit(3)\n")
    fake.chmod(0o755)
    spec = ServerSpec("llama-server", "model.gguf", 1, threads=2, ctx=4096, parallel=4, llama_server_bin=str(fake))
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 3.*unknown model file"):
        ServerProcess(spec, timeout_s=60)
