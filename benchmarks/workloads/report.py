"""The results of run.py as a Markdown table (kept in benchmarks/README.md between markers) and a
bar chart."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- workloads:begin -->", "<!-- workloads:end -->"
LABELS = {"langrt": "langrt", "langrt_no_cache": "langrt, no radix cache", "hf": "HF transformers"}
COLORS = {"langrt": "#1f77b4", "langrt_no_cache": "#aec7e8", "hf": "#ff7f0e"}


def _x(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _targets(row: dict) -> str:
    marks = {"langrt_vs_hf": "vs HF", "cache_on_vs_off": "on/off", "fraction_of_optimum": "hit/opt"}
    return ", ".join(f"{marks[k]} {'met' if t['met'] else 'MISSED'}" for k, t in row["targets"].items())


def table(results: dict) -> str:
    head = ("| workload | programs | langrt prog/s | no-cache prog/s | HF prog/s | cache on/off | langrt/HF | "
            "langrt out tok/s | HF out tok/s | hit rate | optimum | hit/optimum | targets |")  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in results["workloads"]:
        on, off, hf, r = row.get("langrt", {}), row.get("langrt_no_cache", {}), row.get("hf", {}), row["ratios"]
        lines.append(
            f"| {row['name']}: {row['title']} | {on.get('programs', hf.get('programs', '-'))} "
            f"| {on.get('programs_s', 0):.3f} | {off.get('programs_s', 0):.3f} | {hf.get('programs_s', 0):.3f} "
            f"| {_x(r.get('cache_on_vs_off'), 2)} | {_x(r.get('langrt_vs_hf'), 2)} "
            f"| {on.get('output_tok_s', 0):.1f} | {hf.get('output_tok_s', 0):.1f} "
            f"| {_pct(on.get('cache_hit_rate'))} | {_pct(on.get('optimal_hit_rate'))} | {_pct(on.get('fraction_of_optimum'))} "
            f"| {_targets(row)} |"
        )  # fmt: skip
    return "\n".join(lines)


def write_readme_table(results: dict, readme: Path = README) -> Path:
    """Replace the table between the markers (appending a section the first time)."""
    block = f"{BEGIN}\n{table(results)}\n{END}"
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n## Structured-program workloads\n\n" + block + "\n"
    readme.write_text(text)
    return readme


def write_chart(results: dict, path: Path) -> Path:
    """Left: programs/s relative to HF transformers (log scale). Right: langrt's cache hit rate
    against the offline optimum."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in results["workloads"] if "hf" in r]
    names = [r["name"] for r in rows]
    fig, (speed, hits) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.27
    for k, system in enumerate(("langrt", "langrt_no_cache", "hf")):
        values = [r[system]["programs_s"] / r["hf"]["programs_s"] if system in r else 0 for r in rows]
        positions = [i + (k - 1) * width for i in range(len(rows))]
        bars = speed.bar(positions, values, width, label=LABELS[system], color=COLORS[system])
        if system == "langrt":
            speed.bar_label(bars, labels=[f"{v:.2f}x" for v in values], fontsize=7, padding=2)
    speed.set_yscale("log")
    speed.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    speed.set_ylabel("programs/s relative to HF transformers")
    speed.set_xticks(range(len(rows)), names, rotation=30, ha="right", fontsize=8)
    speed.axhline(1, color="grey", linewidth=0.8)
    speed.legend(fontsize=8)
    speed.set_title("Throughput (same programs, greedy/sampled as written)")
    hit = [r["langrt"]["cache_hit_rate"] for r in rows if "langrt" in r]
    optimum = [r["langrt"]["optimal_hit_rate"] for r in rows if "langrt" in r]
    hits.bar(range(len(hit)), optimum, 0.6, color="#dddddd", label="offline optimum")
    hits.bar(range(len(hit)), hit, 0.35, color=COLORS["langrt"], label="langrt hit rate")
    hits.set_ylim(0, 1)
    hits.set_xticks(range(len(hit)), names[: len(hit)], rotation=30, ha="right", fontsize=8)
    hits.legend(fontsize=8, loc="lower right")
    hits.set_title("Radix cache hit rate vs optimum")
    fig.suptitle(f"SmolLM2-135M-Instruct, {results['machine']}, {results['threads']} torch thread per system")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
