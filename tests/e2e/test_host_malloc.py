"""The model process's C allocator keeps freed memory (langrt/mem/host_malloc.py)."""

from __future__ import annotations

import gc
import os
import sys
import time

import pytest

import langrt
from langrt.mem.host_malloc import keep_freed_memory, release_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_glibc_accepts_the_settings():
    assert keep_freed_memory(), "mallopt refused a value (glibc caps the mmap threshold at 32 MiB)"


def test_the_model_process_tunes_malloc_unless_told_not_to(tiny_llama_dir, capfd):
    for disabled in (False, True):
        with langrt.Engine(
            str(tiny_llama_dir), log_level="debug", max_total_tokens=4096, disable_malloc_tuning=disabled
        ) as engine:
            engine.generate("hello", {"max_new_tokens": 1})
        logged = capfd.readouterr().err
        assert ("malloc keeps freed memory: True" in logged) is (not disabled and sys.platform.startswith("linux"))


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_release_hands_freed_small_blocks_back():
    """Small blocks freed (as a tokenizer's build leaves them) stay resident until released,
    even with the model process's settings, which keep up to 1 GiB free."""
    keep_freed_memory()
    blocks = [bytearray(2000) for _ in range(100_000)]  # ~200 MB of heap blocks, not mmaps
    keep = bytearray(100)  # allocated last: the heap's top stays in use
    held = _resident_mb()
    del blocks
    gc.collect()
    freed = _resident_mb()
    release_freed_memory()
    released = _resident_mb()
    assert held - freed < 50, "freeing alone already gave the memory back: nothing to test"
    assert freed - released > 150, f"release gave back {freed - released:.0f} MB of ~200"
    del keep


def test_the_scheduler_builds_a_gguf_files_tokenizer_once_idle(capfd):
    """Start-up leaves it out (ready ~1 s sooner on a 151k vocabulary); plain requests never need
    it; once idle the scheduler builds it, and stop strings find it built."""
    with langrt.Engine(log_level="info", max_total_tokens=2048) as engine:
        out = engine.generate("Hello", {"max_new_tokens": 2, "temperature": 0})
        logged = ""
        for _ in range(100):
            logged += capfd.readouterr().err
            if "tokenizer built while idle" in logged:
                break
            time.sleep(0.1)
        assert "tokenizer built while idle" in logged
        stopped = engine.generate("Hello", {"max_new_tokens": 8, "temperature": 0, "stop": [out["text"][-1:] or "x"]})
        assert stopped["meta_info"]["finish_reason"]["type"] in ("stop", "length")
