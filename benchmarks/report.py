"""The results tables of benchmarks/README.md and of the README's headline results, written from
benchmarks/results/*.json.

    .venv/bin/python -m benchmarks.report           # rewrite both tables between their markers
    .venv/bin/python -m benchmarks.report --check   # exit 1 where a table is not what the files give

One row per results file: the benchmark that wrote it, its headline figures (ratios, speed-ups,
hit rates, as recorded), the commit and CPU it ran on, and whether it is current. A result is
marked stale where a commit after the one it recorded (`meta.commit`, written by results_meta)
touched the code it measures: its benchmark's script and the runtime (`git log <commit>..HEAD --
<paths>`). A file with no recorded commit is marked as such: its figures belong to no known code.

The README's headline table has one row per HEADLINES entry, its figures read from the results
file it names (templates like `{engines.langrt.decode_tok_s_median:.1f}`), followed by the commit,
CPU and status of each file it read.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
HEADLINE_BEGIN, HEADLINE_END = "<!-- headline:begin -->", "<!-- headline:end -->"
# The code every benchmark measures besides its own script: the runtime and its kernels.
RUNTIME = ("langrt", "kernels")
# Benchmarks that measure less than the whole runtime (a change elsewhere leaves them current).
MEASURES = {
    "bench_grammar": ("langrt/constrained",),
    "bench_grammar_vocab": ("langrt/constrained",),
    "bench_regex_dfa": ("langrt/constrained", "kernels/cpu"),
    "bench_one_rule": ("langrt/constrained",),
    "json_schema_suite": ("langrt/constrained",),
    "bench_maskbench": ("langrt/constrained",),
    "bench_sampling": ("langrt/sampling",),
    "bench_kernels": ("kernels",),
    "bench_block_types": ("kernels/cpu", "langrt/model/gguf_loader.py"),
}
# Keys whose numbers are headline figures: ratios between sides, hit rates, fractions of a limit.
HEADLINE = re.compile(r"speedup|ratio|_over_|hit_rate|fraction")
MAX_FIGURES = 4


@dataclass(frozen=True)
class Row:
    name: str  # the results file's stem
    benchmark: str  # the script (or folder) that wrote it; "" where none matches
    figures: list[str]
    commit: str | None
    cpu: str
    status: str


@dataclass(frozen=True)
class Headline:
    """A row of the README's headline table: what is measured, the results file (its stem), and
    templates of langrt's figure and the peer's, filled from that file."""

    what: str
    results: str
    langrt: str
    peer: str = ""


_BUILTIN = "bench_cpu_decode_SmolLM2-135M-Instruct.Q4_1"
_QWEN_1_5B = "bench_cpu_decode_qwen2.5-coder-1.5b"
_LANGRT, _LLAMA, _VS = "summary.engines.langrt", "summary.engines.llama_cpp", "summary.langrt_vs_llama_cpp"
HEADLINES = (
    Headline(
        "Decode, batch 1, built-in model (SmolLM2-135M, Q4_1 GGUF), 2 threads",
        _BUILTIN,
        f"{{{_LANGRT}.decode_tok_s_median:.1f}} tok/s",
        f"llama.cpp {{{_LLAMA}.decode_tok_s_median:.1f}} tok/s (langrt {{{_VS}.decode_median:.2f}}x)",
    ),
    Headline(
        "Time to first token, 1,000-token prompt, built-in model",
        _BUILTIN,
        f"{{{_LANGRT}.ttft_s_median:.2f}} s",
        f"llama.cpp {{{_LLAMA}.ttft_s_median:.2f}} s (langrt {{{_VS}.ttft_speedup_median:.2f}}x as fast)",
    ),
    Headline(
        "Decode, batch 1, Qwen2.5-Coder-1.5B (Q4_K_M GGUF, 1.1 GB), 2 threads",
        _QWEN_1_5B,
        f"{{{_LANGRT}.decode_tok_s_median:.1f}} tok/s",
        f"llama.cpp {{{_LLAMA}.decode_tok_s_median:.1f}} tok/s (langrt {{{_VS}.decode_median:.2f}}x)",
    ),
    Headline(
        "Time to first token, 1,000-token prompt, Qwen2.5-Coder-1.5B",
        _QWEN_1_5B,
        f"{{{_LANGRT}.ttft_s_median:.1f}} s",
        f"llama.cpp {{{_LLAMA}.ttft_s_median:.1f}} s (langrt {{{_VS}.ttft_speedup_median:.2f}}x as fast)",
    ),
    Headline(
        "Start to first answer, then memory once settled (all processes' PSS), Qwen2.5-Coder-1.5B",
        _QWEN_1_5B,
        f"{{{_LANGRT}.start_to_first_answer_s_median:.1f}} s, {{{_LANGRT}.pss_after_load_bytes_median/1e9:.2f}} GB "
        f"({{{_LANGRT}.pss_after_load_median_over_file_plus_kv:.2f}}x file + K/V pool)",
        f"llama.cpp {{{_LLAMA}.start_to_first_answer_s_median:.1f}} s, {{{_LLAMA}.pss_after_load_bytes_median/1e9:.2f}} GB "
        f"({{{_LLAMA}.pss_after_load_median_over_file_plus_kv:.2f}}x)",
    ),
    Headline(
        "MaskBench: 300 real schemas passed, closed objects in schema order",
        "bench_maskbench",
        "default {engines.langrt.passing_pct:.1f}% ({engines.langrt.invalid_accepted} invalid accepted)",
        "xgrammar strict {engines.xgrammar.passing_pct:.1f}% ({engines.xgrammar.invalid_accepted} invalid accepted)",
    ),
    Headline(
        "MaskBench: the same, objects open and in any order",
        "bench_maskbench",
        "any order {engines.langrt-any.passing_pct:.1f}% ({engines.langrt-any.invalid_accepted} invalid accepted)",
        "xgrammar compliant {engines.xgrammar-compliant.passing_pct:.1f}% "
        "({engines.xgrammar-compliant.invalid_accepted} invalid accepted)",
    ),
    Headline(
        "JSON extraction, jump-forward vs token by token, 1 request",
        "bench_json",
        "{by_batch.1.speedup_output_tok_s:.2f}x output tok/s",
    ),
)
FIELD = re.compile(r"\{([^{}:/]+)(?:/([0-9.e+]+))?(?::([^{}]*))?\}")


def fill(template: str, data: dict, name: str) -> str:
    """`template` with each {dotted.path:format} (or {dotted.path/divisor:format}) replaced by that
    value of `data`."""

    def value(match: re.Match) -> str:
        node = data
        for key in match[1].split("."):
            if not isinstance(node, dict) or key not in node:
                raise KeyError(f"results/{name}.json has no {match[1]} (a headline row reads it)")
            node = node[key]
        return format(node / float(match[2]) if match[2] else node, match[3] or "")

    return FIELD.sub(value, template)


def headline_table(repo: Path = REPO, headlines: tuple[Headline, ...] | None = None) -> str:
    headlines = HEADLINES if headlines is None else headlines
    results = repo / "benchmarks" / "results"
    lines = ["| What | langrt | Peer | Results |", "|---|---|---|---|"]
    read: dict[str, dict] = {}
    for h in headlines:
        data = read.setdefault(h.results, json.loads((results / f"{h.results}.json").read_text()))
        link = f"[{h.results}.json](benchmarks/results/{h.results}.json)"
        lines.append(f"| {h.what} | {fill(h.langrt, data, h.results)} | {fill(h.peer, data, h.results)} | {link} |")
    lines.append("")
    runs: dict[str, list[str]] = {}  # the files measured at one commit, on one CPU, of one status
    for name, data in read.items():
        commit = recorded_commit(data)
        status = status_of(commit, source_paths(benchmark_of(name, repo), repo), repo)
        at = f"commit {commit[:7]}" if commit else "no recorded commit"
        runs.setdefault(f"{at}, {cpu_of(data) or 'CPU not recorded'}; {status}", []).append(f"`{name}.json`")
    lines += [f"- {', '.join(names)}: {run}." for run, names in runs.items()]
    return "\n".join(lines)


def git(repo: Path, *args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def benchmark_of(stem: str, repo: Path) -> str:
    """The script or folder under benchmarks/ whose name is the longest prefix of `stem`
    (bench_json_avx2 -> bench_json.py, stress_load -> stress/)."""
    bench = repo / "benchmarks"
    names = [p.stem for p in bench.glob("*.py")] + [
        p.name for p in bench.iterdir() if p.is_dir() and p.name != "results"
    ]
    matches = [n for n in names if stem == n or stem.startswith(n + "_")]
    return max(matches, key=len, default="")


def source_paths(benchmark: str, repo: Path) -> list[str]:
    """The paths whose commits make a result of `benchmark` stale."""
    own = [
        f"benchmarks/{benchmark}.py"
        if (repo / "benchmarks" / f"{benchmark}.py").exists()
        else f"benchmarks/{benchmark}"
    ]
    return (own if benchmark else []) + list(MEASURES.get(benchmark, RUNTIME))


def status_of(commit: str | None, paths: list[str], repo: Path) -> str:
    if commit is None:
        return "no commit recorded"
    if git(repo, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        return f"commit {commit[:7]} not in this repository"
    later = git(repo, "log", "--format=%h", f"{commit}..HEAD", "--", *paths)
    if later:
        hashes = later.split()
        return f"stale: {len(hashes)} later commit{'s' if len(hashes) > 1 else ''} to its code (last {hashes[0]})"
    return "current"


def meta_of(data: dict) -> dict:
    """The run's `meta` block: top level (results_meta), or under `settings` (MaskBench's)."""
    for holder in (data, data.get("settings")):
        if isinstance(holder, dict) and isinstance(holder.get("meta"), dict):
            return holder["meta"]
    return {}


def recorded_commit(data: dict) -> str | None:
    """meta.commit, or a top-level `commit` of files written before results_meta."""
    return meta_of(data).get("commit") or (data.get("commit") if isinstance(data.get("commit"), str) else None)


def cpu_of(data: dict) -> str:
    cpu = meta_of(data).get("cpu") or {}
    if cpu:
        flags = cpu.get("path_flags", cpu.get("flags", []))
        return f"{cpu.get('model', '?')} ({', '.join(flags)})"
    flags = data.get("cpu_flags")
    listed = ", ".join(flags) if isinstance(flags, list) else ""
    model = data.get("cpu_model")  # bench_cpu_decode's own record
    return f"{model} ({listed})" if isinstance(model, str) and listed else listed


def headline(data: dict) -> list[str]:
    """Up to MAX_FIGURES `path: value` of the numbers under headline keys, in file order (the
    meta block left out): ratios as 1.23x, hit rates and fractions as percentages."""
    found: list[str] = []

    def walk(node, path: list[str]) -> None:
        if len(found) >= MAX_FIGURES:
            return
        if isinstance(node, dict):
            for key, value in node.items():
                if not (not path and key == "meta"):
                    walk(value, path + [str(key)])
        elif isinstance(node, (int, float)) and not isinstance(node, bool) and path and HEADLINE.search(path[-1]):
            found.append(f"{'.'.join(path)}: {format_figure(path[-1], node)}")

    walk(data, [])
    return found


def format_figure(key: str, value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if "hit_rate" in key or "fraction" in key:
        return f"{value:.1%}"
    return f"{value:.2f}x"


def collect(repo: Path = REPO) -> list[Row]:
    rows = []
    for path in sorted((repo / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            continue
        benchmark = benchmark_of(path.stem, repo)
        commit = recorded_commit(data)
        status = status_of(commit, source_paths(benchmark, repo), repo)
        rows.append(Row(path.stem, benchmark, headline(data), commit, cpu_of(data), status))
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| results file | benchmark | headline figures | commit | CPU | status |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        figures = "<br>".join(r.figures) or "(none under headline keys)"
        lines.append(
            f"| `results/{r.name}.json` | {r.benchmark or '?'} | {figures} | {r.commit[:7] if r.commit else '-'} "
            f"| {r.cpu or '-'} | {r.status} |"
        )
    current = sum(r.status == "current" for r in rows)
    lines.append("")
    lines.append(
        f"{current} of {len(rows)} results current; the others are older than the code they measure or record no commit."
    )
    return "\n".join(lines)


def with_table(readme: str, body: str, begin: str = BEGIN, end: str = END) -> str:
    """`readme` with the text between `begin` and `end` replaced by `body` (the markers and the
    body appended at the end where the README has none)."""
    block = f"{begin}\n{body}\n{end}"
    if begin in readme and end in readme:
        head, rest = readme.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return readme.rstrip("\n") + f"\n\n## Results files\n\nWritten by `python -m benchmarks.report`.\n\n{block}\n"


def main(argv: list[str] | None = None, repo: Path = REPO) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 where the README's table is out of date"
    )
    args = parser.parse_args(argv)
    tables = {
        repo / "benchmarks" / "README.md": lambda text: with_table(text, table(collect(repo))),
        # the front page's table, where it has the markers
        repo / "README.md": lambda text: (
            with_table(text, headline_table(repo), HEADLINE_BEGIN, HEADLINE_END) if HEADLINE_BEGIN in text else text
        ),
    }
    stale = []
    for path, rewrite in tables.items():
        if not path.exists():
            continue
        text = path.read_text()
        updated = rewrite(text)
        if updated == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.write_text(updated)
            print(f"wrote the results table in {path}")
    for path in stale:
        print(f"{path} is out of date: run python -m benchmarks.report", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
