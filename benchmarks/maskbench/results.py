"""Verdicts per schema and engine, and the summary table.

A schema passes for an engine when it compiles, every valid instance is accepted (each token in
its mask, EOS at the end) and no invalid one is. Compile percentiles are over the schemas that
compiled; mask percentiles over every mask filled (in microseconds). The rows name the schemas and
say where instances were rejected, quoting no more of MaskBench than the token refused (engines'
refusal messages may quote a schema keyword or fragment).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from benchmarks.maskbench.data import Case

STATUSES = ("pass", "fail", "refused")
Decode = Callable[[list[int]], str]


@dataclass
class EngineResult:
    """One engine on one schema."""

    status: str  # "pass" | "fail" | "refused"
    compile_ms: float | None = None
    # refused: langrt's error param, else the exception type, "timeout" or "crash"; failed while
    # walking the instances: "timeout (masks)" or "crash (masks)"
    reason: str | None = None
    errors: list[str] = field(default_factory=list)
    valid_rejected: int = 0
    invalid_accepted: int = 0
    mask_us: list[float] = field(default_factory=list)

    def __post_init__(self):
        assert self.status in STATUSES, self.status
        assert (self.status == "refused") == (self.compile_ms is None), "compiled exactly when not refused"

    @classmethod
    def refused(cls, reason: str, message: str) -> "EngineResult":
        return cls("refused", reason=reason, errors=[message])

    def row(self) -> dict:
        """For the JSON file: all but the mask times, which are summarised."""
        row = {k: v for k, v in asdict(self).items() if k != "mask_us"}
        return row | {"masks": len(self.mask_us), "mask_us_max": max(self.mask_us, default=None)}


def judge(case: Case, compile_ms: float, walks: list[dict], decode: Decode) -> EngineResult:
    """The verdict on a compiled schema from its instances' walks (see worker.walk)."""
    result = EngineResult("pass", compile_ms)
    for n, (instance, w) in enumerate(zip(case.instances, walks, strict=True)):
        result.mask_us += w["mask_us"]
        accepted = w["stop"] is None and w["error"] is None
        if w["error"]:
            result.errors.append(f"{'valid' if instance.valid else 'invalid'} #{n}: {w['error']}")
        if instance.valid and not accepted:
            result.valid_rejected += 1
            result.errors.append(f"valid #{n} rejected at {_position(instance.tokens, w['stop'], decode)}")
        elif not instance.valid and accepted:
            result.invalid_accepted += 1
            result.errors.append(f"invalid #{n} accepted")
    if result.valid_rejected or result.invalid_accepted:
        result.status = "fail"
    return result


def _position(tokens: tuple[int, ...], stop: int, decode: Decode) -> str:
    """Where a walk stopped: the token alone, no context (the results quote none of MaskBench)."""
    if stop == len(tokens):
        return f"EOS, after all {len(tokens)} tokens"
    return f"token {stop} of {len(tokens)} ({decode([tokens[stop]])!r})"


def percentile(values: list[float], p: float) -> float | None:
    return float(np.percentile(np.asarray(values), p)) if values else None


def summarize(results: list[EngineResult]) -> dict:
    compiled = [r.compile_ms for r in results if r.compile_ms is not None]
    masks = [us for r in results for us in r.mask_us]
    passing = sum(r.status == "pass" for r in results)
    return {
        "schemas": len(results),
        "passing": passing,
        "passing_pct": 100 * passing / len(results) if results else None,
        "refused": sum(r.status == "refused" for r in results),
        "compile_timeouts": sum(r.reason == "timeout" for r in results),
        "mask_timeouts": sum(r.reason == "timeout (masks)" for r in results),
        "valid_rejected": sum(r.valid_rejected for r in results),
        "invalid_accepted": sum(r.invalid_accepted for r in results),
        "compile_ms_p50": percentile(compiled, 50),
        "compile_ms_p99": percentile(compiled, 99),
        "mask_us_p50": percentile(masks, 50),
        "mask_us_p99": percentile(masks, 99),
        "masks": len(masks),
        "refusal_reasons": dict(Counter(r.reason for r in results if r.status == "refused").most_common()),
    }


def format_table(summaries: dict[str, dict]) -> str:
    header = ("engine", "schemas passing (%)", "refused", "valid rejected", "invalid accepted")
    header += ("compile p50 / p99 (ms)", "mask p50 / p99 (µs)")
    rows = [header] + [_table_row(name, s) for name, s in summaries.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-|-".join("-" * w for w in widths))
    return "\n".join(lines)


def _table_row(name: str, s: dict) -> tuple[str, ...]:
    passing = f"{s['passing']}/{s['schemas']} ({s['passing_pct']:.1f}%)" if s["schemas"] else "-"
    refused = f"{s['refused']}" + (f" ({s['compile_timeouts']} timeouts)" if s["compile_timeouts"] else "")
    compile_ms = _pair(s["compile_ms_p50"], s["compile_ms_p99"], 2)
    mask_us = _pair(s["mask_us_p50"], s["mask_us_p99"], 1)
    return (name, passing, refused, str(s["valid_rejected"]), str(s["invalid_accepted"]), compile_ms, mask_us)


def _pair(a: float | None, b: float | None, digits: int) -> str:
    return "-" if a is None else f"{a:.{digits}f} / {b:.{digits}f}"


def format_reasons(name: str, summary: dict) -> str:
    reasons = ", ".join(f"{reason} {count}" for reason, count in summary["refusal_reasons"].items())
    return f"{name} refusals by {'error param' if name == 'langrt' else 'exception'}: {reasons or 'none'}"


# Like-for-like pairs: (langrt's mode, the peer's mode that reads schemas the same way).
PAIRS = (
    ("langrt", "xgrammar", "closed objects, schema order (xgrammar strict_mode)"),
    ("langrt-any", "xgrammar-compliant", "open objects, any order (xgrammar non-strict, any whitespace)"),
)


def pair_rows(summaries: dict[str, dict]) -> list[dict]:
    """The PAIRS whose both engines ran: passing, invalid accepted, compile and mask p99."""
    keys = ("passing_pct", "invalid_accepted", "compile_ms_p50", "compile_ms_p99", "mask_us_p99")
    return [
        {"mode": mode, "langrt": a, "peer": b} | {f"{key}": [summaries[a][key], summaries[b][key]] for key in keys}
        for a, b, mode in PAIRS
        if a in summaries and b in summaries
    ]


def format_pairs(summaries: dict[str, dict]) -> str:
    rows = pair_rows(summaries)
    lines = [f"like for like: {r['langrt']} vs {r['peer']} ({r['mode']}): passing {_two(r['passing_pct'], '%')}, "
             f"invalid accepted {r['invalid_accepted'][0]} vs {r['invalid_accepted'][1]}, "
             f"compile p50 {_two(r['compile_ms_p50'], ' ms')}, mask p99 {_two(r['mask_us_p99'], ' µs')}" for r in rows]  # fmt: skip
    return "\n".join(lines)


def _two(pair: list, unit: str) -> str:
    return " vs ".join("-" if v is None else f"{v:.1f}{unit}" for v in pair)
