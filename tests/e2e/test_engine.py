"""langrt.Engine end to end on a tiny random Llama (structure, never content)."""

from __future__ import annotations

import time

import pytest
import torch

import langrt
from langrt.errors import CapacityExceeded, InvalidRequest

PROMPTS = ["Hello there, how are you", "Once upon a time", "1, 2, 3,", "The quick brown fox jumps"]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with langrt.Engine(
        str(tiny_llama_dir), dtype="float32", max_total_tokens=4096, max_running_requests=32,
        context_length=512, log_level="warning",
    ) as engine:  # fmt: skip
        yield engine


def greedy(n, **kw):
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **kw}


def assert_pools_empty(engine):
    """Idle: every slot is free or in the cache unlocked (evictable), nothing queued or running."""
    stats = engine.cache_stats()
    assert stats["kv_available_tokens"] == stats["kv_total_tokens"], "a KV slot leaked or stayed locked"
    assert stats["kv_free_tokens"] + stats["kv_cached_tokens"] == stats["kv_total_tokens"]
    assert stats["running_requests"] == stats["waiting_requests"] == stats["in_flight_requests"] == 0


def test_server_info_names_the_cpu_path(engine):
    from langrt.cpu_features import describe_path
    from langrt_kernels.cpu import isa, unavailable_reason

    assert engine.get_server_info()["cpu_path"] == describe_path("float32", unavailable_reason(), isa())


def test_an_engine_on_a_gguf_file_leaves_torch_to_the_scheduler():
    """The scheduler is the one process that imports torch: an Engine's caller (or the HTTP
    server) serving a GGUF file never loads it (~200 MB, ~2 s). (An HF directory's tokenizer
    imports it, through transformers' AutoTokenizer.)"""
    import subprocess
    import sys

    script = (
        "import sys, langrt; e = langrt.Engine(max_total_tokens=512, log_level='warning'); "
        "e.generate('hi', {'max_new_tokens': 1}); e.get_server_info(); e.shutdown(); print('torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"


def test_result_shape(engine):
    out = engine.generate(PROMPTS[0], greedy(12))
    meta = out["meta_info"]
    assert set(out) == {"text", "output_ids", "meta_info"}
    assert len(out["output_ids"]) == meta["completion_tokens"] == 12
    assert meta["prompt_tokens"] == len(engine.tokenizer.encode(PROMPTS[0]))
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["e2e_latency"] > 0 and meta["cached_tokens"] >= 0
    assert out["text"] == engine.tokenizer.decode(out["output_ids"], skip_special_tokens=True)
    assert_pools_empty(engine)


def test_batch_equals_one_by_one(engine):
    batched = engine.generate(PROMPTS, greedy(16))
    assert [o["meta_info"]["id"] for o in batched] != []
    for prompt, out in zip(PROMPTS, batched):
        alone = engine.generate(prompt, greedy(16))
        assert alone["output_ids"] == out["output_ids"]
    assert_pools_empty(engine)


def test_stream_grows_to_the_same_result(engine):
    """stream=True: results as they grow (cumulative text), the last one equal to the result
    without streaming; only it has a finish reason."""
    whole = engine.generate(PROMPTS[1], greedy(12))
    chunks = list(engine.generate(PROMPTS[1], greedy(12), stream=True))
    assert len(chunks) > 1, "more than one event: the text arrives as it is generated"
    for before, after in zip(chunks, chunks[1:]):
        assert after["text"].startswith(before["text"]) and len(after["output_ids"]) >= len(before["output_ids"])
        assert before["meta_info"]["finish_reason"] is None
    assert chunks[-1]["text"] == whole["text"] and chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]


def test_stream_of_a_batch_is_indexed(engine):
    whole = engine.generate(PROMPTS[:2], greedy(8))
    last = {}
    for chunk in engine.generate(PROMPTS[:2], greedy(8), stream=True):
        last[chunk["index"]] = chunk
    assert [last[i]["output_ids"] for i in (0, 1)] == [w["output_ids"] for w in whole]


def test_stream_closed_early_aborts_and_bad_input_raises(engine):
    stream = engine.generate(PROMPTS[2], greedy(500), stream=True)
    first = next(stream)
    assert first["meta_info"]["finish_reason"] is None
    passes = engine.cache_stats()["forward_passes"]
    stream.close()  # the consumer stops: the request is aborted, nothing is left running
    deadline = time.monotonic() + 30
    while engine.cache_stats()["running_requests"] or engine.cache_stats()["in_flight_requests"]:
        assert time.monotonic() < deadline, "the abandoned request kept running"
        time.sleep(0.01)
    assert engine.cache_stats()["forward_passes"] - passes < 250, "stopped early, not after its 500 tokens"
    assert_pools_empty(engine)
    with pytest.raises(InvalidRequest, match="temperature"):
        next(engine.generate(PROMPTS[0], {"temperature": -1}, stream=True))


def test_input_ids_and_rids(engine):
    ids = engine.tokenizer.encode(PROMPTS[1])
    by_ids = engine.generate(input_ids=[ids, ids[:3]], sampling_params=greedy(5), rid=["a", "b"])
    assert [o["meta_info"]["id"] for o in by_ids] == ["a", "b"]
    assert by_ids[0]["output_ids"] == engine.generate(PROMPTS[1], greedy(5))["output_ids"]
    assert by_ids[1]["meta_info"]["prompt_tokens"] == 3


def test_n_samples_and_seed(engine):
    params = {"max_new_tokens": 10, "temperature": 1.0, "n": 3, "seed": 7, "ignore_eos": True}
    first = engine.generate(PROMPTS[2], params)
    again = engine.generate(PROMPTS[2], params)
    assert len(first) == 3
    assert [o["output_ids"] for o in first] == [o["output_ids"] for o in again], "a seed reproduces"
    assert len({tuple(o["output_ids"]) for o in first}) > 1, "the n samples use different seeds"


def test_seed_independent_of_batch(engine):
    params = {"max_new_tokens": 10, "temperature": 1.0, "seed": 3, "ignore_eos": True}
    alone = engine.generate(PROMPTS[0], params)
    mixed = engine.generate(PROMPTS, [params, greedy(4), {"max_new_tokens": 7}, params])
    assert mixed[0]["output_ids"] == alone["output_ids"]


def test_stop_token_ids_and_min_new_tokens(engine):
    base = engine.generate(PROMPTS[3], greedy(12))["output_ids"]
    stop_at = base[4]
    out = engine.generate(PROMPTS[3], greedy(12, stop_token_ids=[stop_at]))
    first_hit = base.index(stop_at)
    assert out["output_ids"] == base[: first_hit + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
    late = engine.generate(PROMPTS[3], greedy(12, stop_token_ids=[base[0]], min_new_tokens=3))
    assert base[0] not in late["output_ids"][:3], "stops are banned before min_new_tokens"
    assert late["meta_info"]["completion_tokens"] >= 3


def test_stop_string_is_trimmed(engine):
    base = engine.generate(PROMPTS[0], greedy(24))
    text = base["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), "need a visible stop string"
    out = engine.generate(PROMPTS[0], greedy(24, stop=[stop]))
    assert out["text"] == text[: text.index(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    kept = engine.generate(PROMPTS[0], greedy(24, stop=[stop], no_stop_trim=True))
    assert kept["text"].startswith(text[: text.index(stop)] + stop)
    assert_pools_empty(engine)


def test_prefill_only_returns_input_logprobs(engine):
    out = engine.generate(PROMPTS[1], {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    meta = out["meta_info"]
    assert out["text"] == "" and out["output_ids"] == []
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    ids = engine.tokenizer.encode(PROMPTS[1])
    assert [e[1] for e in meta["input_token_logprobs"]] == ids
    assert meta["input_token_logprobs"][0][0] is None
    assert all(e[0] <= 0 for e in meta["input_token_logprobs"][1:])


def test_logprobs_match_reference(engine, tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    out = engine.generate(
        PROMPTS[0], greedy(6), return_logprob=True, logprob_start_len=2, top_logprobs_num=3,
        return_text_in_logprobs=True,
    )  # fmt: skip
    meta = out["meta_info"]
    ids = engine.tokenizer.encode(PROMPTS[0]) + out["output_ids"]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    prompt_len = meta["prompt_tokens"]
    inputs = meta["input_token_logprobs"]
    assert len(inputs) == prompt_len - 2
    for pos, (value, token, text) in zip(range(2, prompt_len), inputs):
        assert token == ids[pos] and abs(value - ref[pos - 1, token].item()) < 1e-4
        assert text == engine.tokenizer.decode([token])
    outputs = meta["output_token_logprobs"]
    assert len(outputs) == 6
    for k, (value, token, _) in enumerate(outputs):
        pos = prompt_len + k
        assert token == ids[pos] and abs(value - ref[pos - 1, token].item()) < 1e-4
        top = meta["output_top_logprobs"][k]
        assert len(top) == 3 and top[0][1] == token, "greedy picks the top logprob"
        assert [t[0] for t in top] == sorted((t[0] for t in top), reverse=True)


@pytest.mark.parametrize(
    "prompt, params, param",
    [
        ("", {}, "text"),
        ("hi", {"max_new_tokens": -1}, "max_new_tokens"),
        ("hi", {"temperature": -0.5}, "temperature"),
        ("hi", {"top_p": 1.5}, "top_p"),
        ("hi", {"top_p": 0}, "top_p"),
        ("hi", {"temprature": 1}, "temprature"),
        ("word " * 600, {}, "prompt"),
        ("word " * 450, {"max_new_tokens": 100}, "max_new_tokens"),
    ],
)
def test_bad_input_names_the_field(engine, prompt, params, param):
    with pytest.raises(InvalidRequest) as info:
        engine.generate(prompt, params)
    assert info.value.param == param
    assert_pools_empty(engine)


def test_bad_batch_runs_nothing(engine):
    with pytest.raises(InvalidRequest):
        engine.generate(["fine", "also fine"], [greedy(4), {"top_k": 0}])
    assert_pools_empty(engine)


def test_out_of_vocab_ids(engine):
    with pytest.raises(InvalidRequest) as info:
        engine.generate(input_ids=[1, 2, 10**6])
    assert info.value.param == "input_ids"


def test_an_engine_that_fails_to_start_closes_its_zmq_context(new_engine):
    """The scheduler exits while loading (int8 asked of a GGUF file, already quantized): the
    Engine raises, and its sockets and zmq context are closed then, not left to the garbage
    collector: a context collected later, on another thread, can block for ever in term() (a
    whole-suite run hung so, in the next test's Engine)."""
    import gc

    import zmq

    def open_contexts() -> set[int]:
        return {id(o) for o in gc.get_objects() if isinstance(o, zmq.Context) and not o.closed}

    before = open_contexts()
    with pytest.raises(RuntimeError, match="failed to start"):
        new_engine(quantization="int8")
    assert open_contexts() - before - {id(zmq.Context.instance())} == set()


def test_request_larger_than_pool(tiny_llama_dir, new_engine):
    small = new_engine(
        str(tiny_llama_dir), dtype="float32", max_total_tokens=64, context_length=512,
        log_level="warning",
    )  # fmt: skip
    with pytest.raises(CapacityExceeded, match="64"):
        small.generate("word " * 40, greedy(40))
    # What fits still runs, one after another if need be.
    outs = small.generate(["a b c", "d e f"], greedy(20))
    assert all(o["meta_info"]["completion_tokens"] == 20 for o in outs)
    assert_pools_empty(small)


def test_many_requests_more_than_rows(tiny_llama_dir, new_engine):
    eng = new_engine(
        str(tiny_llama_dir), dtype="float32", max_total_tokens=2048, max_running_requests=3,
        context_length=256, log_level="warning",
    )  # fmt: skip
    outs = eng.generate([f"prompt number {i}" for i in range(10)], greedy(8))
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [8] * 10
    assert_pools_empty(eng)


def test_async_generate_and_stream_give_generate_s_result(engine):
    """async_generate from another event loop, and async_generate_stream on the engine's own
    (elsewhere it refuses, naming what to use), return what generate returns."""
    import asyncio

    prompt, params = [1, 504, 3458, 282], greedy(6)
    whole = engine.generate(input_ids=prompt, sampling_params=params, rid="sync")
    other = asyncio.run(engine.async_generate(input_ids=prompt, sampling_params=params, rid="async"))
    assert other["output_ids"] == whole["output_ids"] and other["text"] == whole["text"]

    async def collect():
        return [r async for r in engine.async_generate_stream(input_ids=prompt, sampling_params=params)]

    streamed = asyncio.run_coroutine_threadsafe(collect(), engine._loop).result(timeout=120)
    assert streamed[-1]["output_ids"] == whole["output_ids"] and streamed[-1]["text"] == whole["text"]
    with pytest.raises(RuntimeError, match="use generate"):
        asyncio.run(collect())
