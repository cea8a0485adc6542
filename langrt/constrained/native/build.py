"""Build and load the grammar engine's C++ libraries (token_walk.cpp, regex_dfa.cpp): plain C++,
built with the system's g++ on first use (~1 s) and cached under $LANGRT_CACHE_DIR (default
~/.cache/langrt), keyed by the source's hash and flags. LANGRT_CPU_KERNELS=0 turns them off:
their callers then take their Python paths, which give the same results."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable

from langrt import envs

DISABLE_ENV = envs.LANGRT_CPU_KERNELS.name
FLAGS = ("-O3", "-shared", "-fPIC")  # no -march: the library may sit in a home folder several CPUs share
logger = logging.getLogger("langrt.constrained")


def build_library(source: Path) -> ctypes.CDLL:
    """`source` built (once per content) and loaded; raises where it cannot be."""
    if not envs.LANGRT_CPU_KERNELS.get():
        raise RuntimeError(f"{DISABLE_ENV}=0")
    code = source.read_bytes() + " ".join(FLAGS).encode()
    cache = envs.langrt_cache_dir()
    path = cache / f"{source.stem}-{hashlib.sha1(code).hexdigest()[:12]}.so"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:  # built aside, then renamed: processes may race
            built = Path(tmp) / f"{source.stem}.so"
            compiler = str(envs.CXX.get())
            done = subprocess.run(
                [compiler, *FLAGS, "-o", str(built), str(source)], capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-300:]}")
            os.replace(built, path)
    return ctypes.CDLL(str(path))


class LazyLibrary:
    """A library loaded on first use by `load` (build_library plus its function types), or None
    where it cannot be (said once, naming `fallback`)."""

    def __init__(self, load: Callable[[], ctypes.CDLL], fallback: str):
        self._load, self._fallback = load, fallback
        self._lock = threading.Lock()
        self._library: ctypes.CDLL | None = None
        self._tried = False

    def get(self) -> ctypes.CDLL | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    self._library = self._load()
                except Exception as exc:  # noqa: BLE001 - no compiler, a failed build: the Python path, said once
                    logger.warning("%s (the C++ library is not used: %s)", self._fallback, str(exc).strip()[:300])
        return self._library

    def reset(self) -> None:
        """Forget the library (tests that change LANGRT_CPU_KERNELS)."""
        with self._lock:
            self._library, self._tried = None, False
