"""The model process's C allocator tuned (the default) vs glibc's defaults (--disable-malloc-tuning),
side by side on the built-in model (see langrt/mem/host_malloc.py).

Both engines up at once, rounds alternating which goes first; each side's median round.
Workloads: bench_prefix's few-shot wave (64 questions after one 1,205-token preamble: large
activations and K/V gathers), bench_json's 16-request extraction wave (short contexts), and 8
random prompts decoding 64 tokens each (no shared prefix).

    .venv/bin/python benchmarks/bench_host_malloc.py [--quick]
"""

from __future__ import annotations

import ab_engines

if __name__ == "__main__":
    ab_engines.main(__doc__, "bench_host_malloc", {"tuned": {}, "glibc_default": {"disable_malloc_tuning": True}},
                    few_shot_tokens=8, decode_name="no_reuse", decode_prompts=8)  # fmt: skip
