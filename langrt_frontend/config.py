"""`global_config`: the frontend's process-wide settings (SGLang's `sgl.global_config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GlobalConfig:
    default_backend: Any = None  # what `run` uses when no backend= is given (set_default_backend)
    verbosity: int = 0  # >= 2: print each program's text when `run` finishes
    enable_parallel_encoding: bool = True  # accepted for SGLang compatibility; no effect
    enable_precache_with_tracing: bool = True  # run_batch warms the cache with the shared prefix
    precache_min_chars: int = 32  # a shared prefix shorter than this is not worth a request
    skip_special_tokens_in_output: bool = True  # sent to the runtime as skip_special_tokens
    spaces_between_special_tokens_in_out: bool = True


global_config = GlobalConfig()
