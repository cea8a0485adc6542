"""What a workload sent and got back, and the cache figures computed from it.

`RecordingBackend` wraps any frontend backend and keeps every /generate payload with its
response. From those: the measured hit rate (sum of the runtime's per-request `cached_tokens`
over the sum of `prompt_tokens`), and the offline optimum for the same token sequences.

The optimum: an ideal runtime with an unbounded pool, running the requests in the best order the
program allows (depth-first over the prefix tree), computes each distinct prompt prefix once,
except that
- a prompt token whose K/V a request already produced by decoding (a turn's answer, quoted in the
  next turn's prompt) is free, and
- every request computes at least its last prompt token (its logits are what it asks for), so a
  prompt that is entirely a prefix of earlier ones still costs one token.
So optimal computed tokens = sum over prefix-tree nodes of max(1 if the node is a prompt prefix
nobody decoded else 0, number of requests whose prompt ends there), and the optimal hit rate is
1 - computed / total prompt tokens. The real runtime can only do as well or worse: it also
recomputes positions whose input logprobs a request asks for, and whatever it evicts.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator


@dataclass(frozen=True)
class Exchange:
    """One prompt of a /generate call (a batch payload gives several) and its response."""

    prompt: str
    response: dict
    kind: str  # "gen" | "score" (select) | "warm_up" (cache warm-up: max_new_tokens 0, no logprobs)

    @property
    def meta(self) -> dict:
        return self.response["meta_info"]


@dataclass
class RecordingBackend:
    """A backend that forwards to `inner` and records each prompt with its response."""

    inner: object
    exchanges: list[Exchange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def chat_template(self):
        return self.inner.chat_template

    @property
    def caches_prefixes(self) -> bool:
        return getattr(self.inner, "caches_prefixes", True)

    def generate(self, payload: dict):
        response = self.inner.generate(payload)
        texts = payload["text"] if isinstance(payload["text"], list) else [payload["text"]]
        responses = response if isinstance(response, list) else [response]
        if len(responses) != len(texts):  # n > 1: one prompt, several samples
            texts = texts * len(responses)
        kind = _kind(payload)
        with self.lock:
            self.exchanges += [Exchange(t, r, kind) for t, r in zip(texts, responses)]
        return response

    def generate_stream(self, payload: dict) -> Iterator[dict]:
        raise NotImplementedError("the workloads do not stream")

    def flush_cache(self) -> bool:
        return self.inner.flush_cache()

    def get_server_info(self) -> dict:
        return self.inner.get_server_info()

    def get_model_info(self) -> dict:
        return self.inner.get_model_info()

    # ---- figures --------------------------------------------------------------------------

    def totals(self) -> dict:
        metas = [e.meta for e in self.exchanges]
        prompt = sum(m["prompt_tokens"] for m in metas)
        cached = sum(m.get("cached_tokens", 0) for m in metas)
        return {
            "requests": len(metas),
            "warm_up_requests": sum(e.kind == "warm_up" for e in self.exchanges),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "output_tokens": sum(m["completion_tokens"] for m in metas),
            "cache_hit_rate": cached / prompt if prompt else 0.0,
        }


def _kind(payload: dict) -> str:
    if payload.get("sampling_params", {}).get("max_new_tokens") != 0:
        return "gen"
    return "score" if payload.get("return_logprob") else "warm_up"


def optimal_hit_rate(sequences: list[tuple[list[int], list[int]]]) -> float:
    """The offline optimum (module docstring) for (prompt ids, output ids) pairs."""
    children: dict[tuple[int, int], int] = {}
    prompt_nodes: set[int] = set()
    decoded_nodes: set[int] = set()
    ends: Counter[int] = Counter()

    def walk(ids: list[int], visit: set[int] | None) -> int:
        node = 0
        for token in ids:
            node = children.setdefault((node, token), len(children) + 1)
            if visit is not None:
                visit.add(node)
        return node

    total = 0
    for prompt, output in sequences:
        total += len(prompt)
        ends[walk(prompt, prompt_nodes)] += 1
    for prompt, output in sequences:
        # K/V exists for the prompt and every output token but the last (sampled, not yet run).
        node = walk(prompt, None)
        for token in output[:-1]:
            node = children.setdefault((node, token), len(children) + 1)
            decoded_nodes.add(node)
    computed = sum(ends.values())  # every request's last prompt token
    computed += sum(1 for node in prompt_nodes if node not in decoded_nodes and node not in ends)
    return 1 - computed / total if total else 0.0
