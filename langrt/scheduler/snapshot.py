"""What the scheduler shows the dashboard (GET /dashboard/state): the prefix tree, the running
batch, the waiting queue, the grammars and the counters, as plain JSON-ready values.

Computed only when asked (a `SnapshotRequest` between two steps) and bounded: the tree by
`max_nodes` / `max_depth` (mem/tree_snapshot.py), the request lists by `max_requests`. Token
ids stay ids; the main process turns them into text.
"""

from __future__ import annotations

from langrt.messages import SnapshotRequest
from langrt.request import Req

PROMPT_HEAD_TOKENS = 24  # prompt ids sent per request, for its label


def scheduler_snapshot(scheduler, ask: SnapshotRequest) -> dict:
    running = list(scheduler.running) + ([scheduler.chunked] if scheduler.chunked is not None else [])
    waiting = list(scheduler.waiting)
    return {
        "tree": scheduler.cache.snapshot(ask.max_nodes, ask.max_depth),
        "cache": _cache_sizes(scheduler),
        "running": [_describe(r) for r in running[: ask.max_requests]],
        "waiting": [_describe(r) for r in waiting[: ask.max_requests]],
        "num_running": len(running),
        "num_waiting": len(waiting),
        "num_grammar_queue": len(scheduler.grammar_queue),
        "counters": _counters(scheduler),
        "grammar": _grammar(scheduler, running),
    }


def live_counts(scheduler) -> dict:
    """What /metrics adds to `Scheduler.cache_stats`: requests waiting for a grammar, and the
    output so far of unfinished requests (the main process counts finished ones)."""
    live = [*scheduler.running, *scheduler.waiting, *filter(None, [scheduler.chunked])]
    return {
        "grammar_queue_requests": len(scheduler.grammar_queue),
        "live_output_tokens": sum(len(r.output_ids) for r in live),
    }


def _cache_sizes(scheduler) -> dict:
    """The pool's sizes without the full tree walk `CacheManager.stats` does for its node count."""
    cache = scheduler.cache
    return {"kv_total_tokens": cache.size, "kv_available_tokens": cache.available, "kv_free_tokens": cache.free_slots}


def _describe(req: Req) -> dict:
    return {
        "rid": req.rid,
        "status": req.status.value,
        "prompt_head": req.input_ids[:PROMPT_HEAD_TOKENS],
        "prompt_tokens": req.prompt_len,
        "cached_tokens": req.cached_tokens,
        "computed_tokens": req.kv_len,
        "generated_tokens": len(req.output_ids),
        "max_new_tokens": req.params.max_new_tokens,
        "grammar": _grammar_state(req),
        "drafts": len(req.draft_ids),
        # set by speculative decoding where it runs; absent otherwise
        "drafts_accepted": getattr(req, "spec_accepted_tokens", None),
        "mask_ms": 1e3 * req.grammar_mask_s / req.grammar_masks if req.grammar_masks else None,
    }


def _grammar_state(req: Req) -> str | None:
    matcher = req.matcher
    if matcher is None:
        return None
    return "terminated" if matcher.is_terminated() else f"active ({req.grammar_masks} masks)"


def _counters(scheduler) -> dict:
    stats = scheduler.stats
    return {
        "prompt_tokens": stats.prompt_tokens,
        "cached_prompt_tokens": stats.cached_tokens,
        "cache_hit_rate": stats.cache_hit_rate,
        "retractions": stats.retractions,
        "forward_passes": stats.forward_passes,
        "forward_tokens": stats.forward_tokens,
        "drafted_tokens": stats.drafted_tokens,
        "jump_forward_tokens": stats.jump_forward_tokens,
        "certain_tail_tokens": stats.certain_tail_tokens,
        # with the finished requests' output counted by the main process (whose updates arrive
        # before this reply, in order): the tokens output so far
        "live_output_tokens": live_counts(scheduler)["live_output_tokens"],
    }


def _grammar(scheduler, running: list[Req]) -> dict:
    queue = scheduler.grammar_queue
    masks = [(r.grammar_mask_s, r.grammar_masks) for r in running if r.grammar_masks]
    return {
        "compiled": [
            {"kind": c.kind, "text": c.text, "ms": 1e3 * c.seconds, "ok": c.ok} for c in reversed(queue.compiles)
        ],
        "cache_hits": queue.cache_hits,
        "waiting": len(queue),
        "running_mask_ms": 1e3 * sum(s for s, _ in masks) / sum(n for _, n in masks) if masks else None,
    }
