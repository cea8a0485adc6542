"""The HTML of a program report (report.py): static, self-contained, every program text escaped."""

from __future__ import annotations

import html
from collections import defaultdict

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2230; max-width: 1200px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; } th, td { padding: 3px 8px; border-bottom: 1px solid #e4e6ee; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.shared-prefix { border: 1px solid #dde; border-left: 4px solid #9aa3b5; border-radius: 4px; padding: 6px 10px; margin: 8px 0; }
.shared-prefix.fork { border-left-color: #29a35a; background: #f3fbf6; }
.prefix-text { font-family: ui-monospace, monospace; font-size: 12px; white-space: pre-wrap; background: #f6f7f9; padding: 4px 6px; }
.cut { color: #889; font-style: italic; }
.kind-gen { fill: #3b6fd8; } .kind-select { fill: #e08a3e; } .kind-prefix { fill: #9aa3b5; }
.cached { fill: #29a35a; opacity: .8; }
"""
KINDS = {"gen": "gen", "select": "select", "prefix": "prefix (cache warm-up)"}


def excerpt(text: str, head: int = 80, tail: int = 80) -> str:
    """`text` shortened in the middle, escaped."""
    if len(text) <= head + tail + 5:
        return html.escape(text)
    return f"{html.escape(text[:head])}<span class='cut'> [… {len(text) - head - tail} characters …] </span>{html.escape(text[-tail:])}"


def _meta_sum(call, key: str) -> int:
    return sum(int(m.get(key) or 0) for m in call.metas)


def _label(i: int, call, names: dict[int, str]) -> str:
    return f"#{i} {call.kind}" + (f" {names[i]}" if i in names else "")


def render_page(calls, names: dict[int, str], groups) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>langrt program report</title><style>{STYLE}</style></head><body>"
    ]
    parts += [_summary(calls), _timeline(calls, names), _shared(calls, names, groups), _requests(calls, names)]
    return "\n".join(parts) + "</body></html>\n"


def _summary(calls) -> str:
    wall = max((c.end for c in calls), default=0.0) - min((c.start for c in calls), default=0.0)
    prompt, cached = (
        sum(_meta_sum(c, "prompt_tokens") for c in calls),
        sum(_meta_sum(c, "cached_tokens") for c in calls),
    )
    by_kind = defaultdict(lambda: [0, 0.0, 0, 0])
    for c in calls:
        row = by_kind[c.kind]
        row[0] += 1
        row[1] += c.end - c.start
        row[2] += _meta_sum(c, "cached_tokens")
        row[3] += _meta_sum(c, "completion_tokens")
    rows = "".join(
        f"<tr><td>{KINDS.get(k, k)}</td><td class='num'>{n}</td><td class='num'>{t:.3f}</td><td class='num'>{ct}</td><td class='num'>{out}</td></tr>"
        for k, (n, t, ct, out) in by_kind.items()
    )
    share = f"{100 * cached / prompt:.1f} %" if prompt else "–"
    return (
        f"<h1>Program report</h1><p>{len(calls)} requests in {wall:.3f} s; {prompt} prompt tokens, of which {cached} "
        f"came from the prefix cache ({share}); {sum(_meta_sum(c, 'completion_tokens') for c in calls)} generated.</p>"
        "<h2>Where the time went</h2><table><tr><th>kind</th><th class='num'>requests</th><th class='num'>seconds "
        "(summed over lanes)</th><th class='num'>cached tokens</th><th class='num'>generated</th></tr>"
        f"{rows}</table>"
    )


def lane_names(calls) -> dict[str, str]:
    """Each sending thread's label: `program` for the thread the program body ran on (it sends
    fork warm-ups), `state 1`, `state 2`, ... for executor threads in order of first request."""
    names, states = {}, 0
    for c in calls:
        if c.lane not in names:
            if c.lane.startswith("langrt-frontend-state#"):
                states += 1
                names[c.lane] = f"state {states}"
            else:
                names[c.lane] = "program (" + c.lane.split("#")[0] + ")"
    return names


def _timeline(calls, names) -> str:
    labels = lane_names(calls)
    lanes = list(labels)
    t0 = min((c.start for c in calls), default=0.0)
    span = max(1e-6, max((c.end for c in calls), default=1.0) - t0)
    width, lane_h, left = 900, 26, 150
    svg = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{left + width + 20}' height='{lane_h * len(lanes) + 30}' id='timeline'>"
    ]
    for k, lane in enumerate(lanes):
        svg.append(f"<text x='4' y='{lane_h * k + 18}' font-size='12'>{html.escape(labels[lane][:22])}</text>")
    for i, c in enumerate(calls):
        x = left + width * (c.start - t0) / span
        w = max(2.0, width * (c.end - c.start) / span)
        y = lane_h * lanes.index(c.lane) + 4
        prompt = _meta_sum(c, "prompt_tokens")
        cached_w = w * _meta_sum(c, "cached_tokens") / prompt if prompt else 0
        title = html.escape(
            f"{_label(i, c, names)}: {1e3 * (c.end - c.start):.0f} ms, {prompt} prompt tokens, {_meta_sum(c, 'cached_tokens')} cached"
        )
        svg.append(
            f"<g><title>{title}</title><rect class='kind-{c.kind}' x='{x:.1f}' y='{y}' width='{w:.1f}' height='18' rx='2'/>"
            f"<rect class='cached' x='{x:.1f}' y='{y + 14}' width='{cached_w:.1f}' height='4'/></g>"
        )
    svg.append(
        f"<text x='{left}' y='{lane_h * len(lanes) + 22}' font-size='11'>0 s</text>"
        f"<text x='{left + width - 40}' y='{lane_h * len(lanes) + 22}' font-size='11'>{span:.3f} s</text></svg>"
    )
    return (
        "<h2>Timeline</h2><p>One lane per program state (forks run on their own threads); blue gen, orange select, grey a cache "
        "warm-up; the green strip is the share of the prompt served from the cache.</p>" + "".join(svg)
    )


def _shared(calls, names, groups) -> str:
    out = ["<h2>Shared prefixes</h2>"]
    if not groups:
        out.append("<p>No two requests share a prefix.</p>")
    for g in groups:
        members = ", ".join(_label(i, calls[i], names) for i in g.members)
        cached = sum(_meta_sum(calls[i], "cached_tokens") for i in g.members)
        fork = g.is_fork(calls)
        note = (
            f" <b>fork</b>: {len(g.forked)} requests continue from its end ({', '.join(_label(i, calls[i], names) for i in g.forked)})."
            if fork
            else ""
        )
        out.append(
            f"<div class='shared-prefix{' fork' if fork else ''}' data-members='{len(g.members)}' data-chars='{g.chars}'>"
            f"<div>{len(g.members)} requests share {g.chars} characters; they were served {cached} prompt tokens from the "
            f"cache. Requests: {html.escape(members)}.{note}</div>"
            f"<div class='prefix-text'>{excerpt(calls[g.members[0]].prompt[: g.chars])}</div></div>"
        )
    return "".join(out)


def _requests(calls, names) -> str:
    rows, labels = [], lane_names(calls)
    for i, c in enumerate(calls):
        output = " | ".join(c.outputs) if c.kind == "gen" else ""
        rows.append(
            f"<tr><td>{i}</td><td>{html.escape(labels[c.lane][:22])}</td><td>{c.kind}</td><td>{html.escape(names.get(i, ''))}</td>"
            f"<td class='num'>{_meta_sum(c, 'prompt_tokens')}</td><td class='num'>{_meta_sum(c, 'cached_tokens')}</td>"
            f"<td class='num'>{_meta_sum(c, 'completion_tokens')}</td><td class='num'>{1e3 * (c.end - c.start):.0f}</td>"
            f"<td>{excerpt(output, 40, 20)}</td></tr>"
        )
    return (
        "<h2>Requests</h2><table id='requests'><tr><th>#</th><th>lane</th><th>kind</th><th>variable</th>"
        "<th class='num'>prompt</th><th class='num'>cached</th><th class='num'>generated</th><th class='num'>ms</th>"
        "<th>output</th></tr>" + "".join(rows) + "</table>"
    )
