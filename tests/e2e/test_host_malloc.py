"""The model process's C allocator keeps freed memory (langrt/mem/host_malloc.py)."""

from __future__ import annotations

import sys

import pytest

import langrt
from langrt.mem.host_malloc import keep_freed_memory


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
