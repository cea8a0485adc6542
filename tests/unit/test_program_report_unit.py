"""The program report's pieces without a server (issue 28): shared prefixes against brute
force, the recording backend, and escaping."""

from __future__ import annotations

import itertools
import random

from langrt_frontend.recording import RecordingBackend, RunLog
from langrt_frontend.report import shared_prefixes
from langrt_frontend.report_html import render_page


def _lcp(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_shared_prefixes_match_brute_force():
    rng = random.Random(0)
    for trial in range(200):
        stems = ["".join(rng.choice("ab") for _ in range(rng.randrange(0, 6))) for _ in range(3)]
        prompts = [
            rng.choice(stems) + "".join(rng.choice("abc") for _ in range(rng.randrange(0, 4)))
            for _ in range(rng.randrange(1, 7))
        ]
        groups = shared_prefixes(prompts, min_chars=1)
        found = {(g.chars, g.members) for g in groups}
        # every prefix two prompts share up to where they differ is a group holding both
        for i, j in itertools.combinations(range(len(prompts)), 2):
            n = _lcp(prompts[i], prompts[j])
            if n >= 1:
                assert any(c == n and i in m and j in m for c, m in found), (prompts, i, j)
        for g in groups:
            texts = [prompts[i] for i in g.members]
            prefix = texts[0][: g.chars]
            assert all(t.startswith(prefix) for t in texts)
            outside = [p for k, p in enumerate(prompts) if k not in g.members]
            assert not any(p.startswith(prefix) for p in outside), "members are all who share it"
            longer = [t for t in texts if len(t) > g.chars]
            assert len(g.forked) + len(longer) == len(texts)
            assert len({t[g.chars] for t in longer}) != 1 or g.forked, "maximal: the texts differ or end here"


class FakeBackend:
    chat_template = object()

    def __init__(self):
        self.flushed = False

    def generate(self, payload):
        texts = payload["text"]
        if isinstance(texts, list):
            return [
                {"text": "", "meta_info": {"prompt_tokens": 5, "cached_tokens": 3, "input_token_logprobs": [1]}}
                for _ in texts
            ]
        return {
            "text": "<b>out</b>",
            "meta_info": {"id": "r1", "prompt_tokens": 9, "cached_tokens": 4, "completion_tokens": 2},
        }

    def flush_cache(self):
        self.flushed = True
        return True


def test_recording_backend_records_and_delegates():
    backend = RecordingBackend(FakeBackend(), RunLog())
    assert backend.chat_template is FakeBackend.chat_template and backend.flush_cache() and backend.inner.flushed
    backend.generate({"text": "Q: <script>x</script>", "sampling_params": {"max_new_tokens": 4}})
    backend.generate({"text": "Q: <script>x</script>", "sampling_params": {"max_new_tokens": 0}})
    backend.generate({"text": "Q: <script>x</script> yes", "sampling_params": {"max_new_tokens": 0}})
    backend.generate(
        {"text": ["Q: ", "Q: yes", "Q: no"], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True}
    )
    calls = backend.run_log.calls
    assert [c.kind for c in calls] == ["gen", "prefix", "prefix", "select"]
    assert calls[3].choices == ["yes", "no"] and "input_token_logprobs" not in calls[3].metas[0]
    assert calls[0].metas[0]["cached_tokens"] == 4 and calls[0].end >= calls[0].start
    groups = shared_prefixes([c.prompt for c in calls], min_chars=2)
    page = render_page(calls, {0: "answer"}, groups)
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>out</b>" not in page
    assert "shared-prefix fork" not in page, "a gen after a warm-up of its text is no fork"
    backend.generate({"text": "Q: <script>x</script>", "sampling_params": {"max_new_tokens": 4}})
    page = render_page(calls, {}, shared_prefixes([c.prompt for c in calls], min_chars=2))
    assert page.count("shared-prefix fork") == 1, "two gens continue from the same text"
