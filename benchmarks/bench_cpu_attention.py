"""The cpu attention backend (langrt's C++ kernel for decode and draft rows and prompts, the default on CPU)
vs the torch backend (K/V gathered into padded blocks, SDPA), side by side on the built-in model.

Both engines up at once, rounds alternating which goes first; each side's median round.
Workloads: bench_prefix's few-shot wave (64 questions after one 1,205-token preamble, 32 new
tokens each: decode over a long shared prefix), bench_json's 16-request extraction wave
(jump-forward drafts, short contexts), and 32 random prompts decoding 64 tokens each.

    .venv/bin/python benchmarks/bench_cpu_attention.py [--quick]
"""

from __future__ import annotations

import ab_engines

if __name__ == "__main__":
    ab_engines.main(__doc__, "bench_cpu_attention", {"cpu": {"attention_backend": "cpu"}, "torch": {"attention_backend": "torch"}},
                    few_shot_tokens=32, decode_name="decode_32", decode_prompts=32)  # fmt: skip
