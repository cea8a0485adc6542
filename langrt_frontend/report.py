"""A program run as a static HTML page (`ProgramState.report(path)`): where its time went and
what the prefix cache saved.

    state = fork_and_vote.run(question=..., backend=backend)
    state.report("fork_and_vote.html")

The page shows a timeline (one lane per program state: forks run on their own threads), every
request with its prompt, cached and generated tokens, and the prefixes its requests share:
found from the prompt texts (a radix split of the texts by their common prefixes), each with
the requests that share it and the tokens they were served from the cache. A prefix that two
or more gens or selects continue from exactly where it ends is what a fork (or `n > 1`) shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from langrt_frontend.recording import RecordedCall, RunLog
from langrt_frontend.report_html import render_page

MIN_SHARED_CHARS = 16  # shorter common prefixes (a chat template's first tag) are not worth a row


@dataclass(frozen=True)
class SharedPrefix:
    chars: int  # its length in characters
    members: tuple[int, ...]  # indices of the calls whose prompts start with it
    forked: tuple[int, ...]  # those whose prompt is exactly it: continued from its end

    def is_fork(self, calls: list[RecordedCall]) -> bool:
        """Two or more gens or selects continue from its end (a fork, or n > 1); a cache
        warm-up followed by its one request is not a fork."""
        return sum(calls[i].kind != "prefix" for i in self.forked) >= 2


def shared_prefixes(prompts: list[str], min_chars: int = MIN_SHARED_CHARS) -> list[SharedPrefix]:
    """Every prefix that two or more prompts share and where they differ (or end): the inner
    nodes of the prompts' radix tree, longest first."""
    found: list[SharedPrefix] = []
    stack = [(tuple(range(len(prompts))), 0)]
    while stack:
        members, start = stack.pop()
        texts = [prompts[i] for i in members]
        end = _common_length(texts, start)
        if len(members) >= 2 and end >= min_chars:
            forked = tuple(i for i in members if len(prompts[i]) == end)
            found.append(SharedPrefix(end, members, forked))
        branches: dict[str, list[int]] = {}
        for i in members:
            if len(prompts[i]) > end:
                branches.setdefault(prompts[i][end], []).append(i)
        stack += [(tuple(b), end) for b in branches.values() if len(b) >= 2]
    return sorted(found, key=lambda g: (-g.chars, g.members))


def _common_length(texts: list[str], start: int) -> int:
    end = min(map(len, texts))
    first = texts[0]
    for i in range(start, end):
        if any(t[i] != first[i] for t in texts[1:]):
            return i
    return end


def variable_names(executor, calls: list[RecordedCall]) -> dict[int, str]:
    """Call index -> the variable its gen or select set: gens by their response's id, selects
    by their choices holding the chosen value."""
    by_id = {meta.get("id"): i for i, c in enumerate(calls) for meta in c.metas if meta.get("id")}
    names: dict[int, str] = {}
    with executor.lock:
        items = [(n, executor.variables.get(n), m) for n, m in executor.meta_info.items()]
    for name, value, meta in items:
        metas, values = (meta, value) if isinstance(meta, list) else ([meta], [value])
        for m, v in zip(metas, values if isinstance(values, list) else [values]):
            if isinstance(m, dict) and m.get("id") in by_id:
                names[by_id[m["id"]]] = name
            elif isinstance(m, dict) and "normalized_prompt_logprobs" in m:
                for i, c in enumerate(calls):
                    if c.kind == "select" and i not in names and v in c.choices:
                        names[i] = name
                        break
    return names


def write_report(state, path) -> Path:
    """Render `state`'s run (it must have run through `SglFunction.run` on a native backend)."""
    backend = state.executor.backend
    run_log: RunLog | None = getattr(backend, "run_log", None)
    if run_log is None:
        raise ValueError(
            "this program state has no recorded run: reports cover programs started with "
            "`function.run(...)` on a native backend (RuntimeEndpoint, Runtime, EngineBackend)"
        )
    state.executor.sync()
    calls = sorted(run_log.calls, key=lambda c: c.start)
    names = variable_names(state.executor, calls)
    groups = shared_prefixes([c.prompt for c in calls])
    out = Path(path)
    out.write_text(render_page(calls, names, groups), encoding="utf-8")
    return out
