"""Numbers a reader can trust: every measured figure quoted in README.md and docs/ is in a results
file that the same page links, and no link or repository path in them is dangling.

A figure is a number with a unit of measure (`1.63x`, `89%`, `261.2 tok/s`, `7 ms`, `0.39 s`)
outside code blocks. It counts as found when a number in one of the page's linked
`benchmarks/results/*.json` files rounds to it at the figure's own precision (a ratio, a
percentage, or the same quantity in s / ms / µs). Settings that happen to carry a unit (a time
limit, a default interval) are not measurements: `SETTINGS` names each with what it is.
Fast: reads text and JSON files only (the snippets themselves run in tests/e2e/test_readme.py).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# (page, figure) -> what the figure is: a setting, not a measurement, so no results file holds it.
SETTINGS = {
    ("docs/architecture.md", "1.5x"): "the router's load-imbalance threshold",
    ("docs/dashboard.md", "30 s"): "the window in which a node counts as recently hit",
    ("docs/dashboard.md", "60 s"): "the longest SSE push interval a client may ask for",
    ("docs/dashboard.md", "0.25 s"): "the shortest SSE push interval, and the default",
    ("docs/dashboard.md", "500 ms"): "the polling interval that bench_dashboard.py sets up",
    ("docs/serving.md", "5 s"): "/health_generate's window for recent output",
    ("docs/serving.md", "10 s"): "/health_generate's probe time limit",
    ("docs/serving.md", "30 s"): "--body-read-timeout's default",
}

# A ratio is written `1.63x` (`6 x 16` is a shape); other units may follow a space.
_FIGURE = re.compile(r"(?<![\w.,/-])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?:(x)|\s?(%|tok/s|ms|µs|us|s))(?![\w/])")
_FENCED = re.compile(r"^```.*?^```", flags=re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_BACKTICKED = re.compile(r"`([^`\n]+)`")
_RESULTS = re.compile(r"benchmarks/results/[\w.-]+\.json")
TOP_LEVEL = ("langrt/", "langrt_frontend/", "kernels/", "benchmarks/", "tests/", "examples/", "docs/",
             "scripts/", "deploy/", ".ci/")  # fmt: skip


def prose(text: str) -> str:
    """The page without its fenced code blocks (commands and programs, not figures)."""
    return _FENCED.sub("", text)


def figures(text: str) -> list[tuple[str, float, int, str]]:
    """(as written, value, decimals, unit) for each measured-looking figure of the prose."""
    found = []
    for match in _FIGURE.finditer(prose(text)):
        whole, decimals, unit = match.group(1), match.group(2) or "", match.group(3) or match.group(4)
        value = float(whole.replace(",", "") + ("." + decimals if decimals else ""))
        found.append((match.group(0), value, len(decimals), unit))
    return found


def numbers_in(path: Path) -> list[float]:
    """Every number anywhere in a JSON file."""
    out: list[float] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            out.append(float(node))

    walk(json.loads(path.read_text()))
    return out


@lru_cache(maxsize=None)
def results_numbers(relative: str) -> tuple[float, ...]:
    return tuple(numbers_in(ROOT / relative))


def matches(value: float, decimals: int, unit: str, number: float) -> bool:
    """Whether a stored `number` is the figure as written (ratios, fractions as %, s/ms/µs)."""
    scales = (1.0, 100.0) if unit == "%" else (1.0, 1000.0, 0.001) if unit in ("s", "ms", "µs", "us") else (1.0,)
    return any(round(number * scale, decimals) == value for scale in scales)


def linked_results(text: str) -> list[str]:
    return sorted(set(_RESULTS.findall(text)))


def unfound_figures(text: str, name: str) -> list[str]:
    """The figures of page `name` (its text) that no results file it links holds."""
    files = [f for f in linked_results(text) if (ROOT / f).is_file()]
    pool = [n for f in files for n in results_numbers(f)]
    unfound = []
    for written, value, decimals, unit in figures(text):
        if (name, written) in SETTINGS:
            continue
        if not any(matches(value, decimals, unit, number) for number in pool):
            unfound.append(written)
    return unfound


def dangling_links(text: str, folder: Path) -> list[str]:
    """Relative markdown links (from the page's `folder`) and backticked repository paths (from
    the root) that name nothing."""
    dangling = []
    for target in _LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        if not (folder / target.split("#")[0]).exists():
            dangling.append(target)
    for span in _BACKTICKED.findall(prose(text)):
        path = span.strip().split("::")[0]
        if path.startswith(TOP_LEVEL) and " " not in path and not re.search(r"[*?<>{}|=$]", path):
            if not (ROOT / path).exists():
                dangling.append(path)
    return dangling


def test_the_figure_finder_reads_units_and_precision():
    text = "1.63x faster, 89% pass, 261.2 tok/s, 1,340 tok/s, 7 ms, 0.39 s; not x86, 6 x 16, Q4_1 or `--port 30000`.\n```\n9 s\n```"
    assert [(w, v, d) for w, v, d, _ in figures(text)] == [
        ("1.63x", 1.63, 2), ("89%", 89.0, 0), ("261.2 tok/s", 261.2, 1), ("1,340 tok/s", 1340.0, 0),
        ("7 ms", 7.0, 0), ("0.39 s", 0.39, 2),
    ]  # fmt: skip
    assert matches(1.63, 2, "x", 1.6337) and not matches(1.64, 2, "x", 1.6337)
    assert matches(89, 0, "%", 0.89) and matches(7, 0, "ms", 0.0071) and not matches(7, 0, "x", 0.007)


def test_a_page_with_a_figure_its_results_do_not_hold_fails():
    assert (ROOT / "benchmarks" / "results" / "bench_cpu_decode.json").is_file()
    text = "Decode 1.63x llama.cpp (`benchmarks/results/bench_cpu_decode.json`), and 9.99x more; 7777 s.\n"
    assert unfound_figures(text, "docs/probe.md") == ["9.99x", "7777 s"]
    assert unfound_figures("1.63x, linking no results file.", "docs/probe.md") == ["1.63x"]
    text = "See [the results](../benchmarks/results/nothing.json), [models](models.md) and `langrt/nothing.py`."
    assert dangling_links(text, ROOT / "docs") == ["../benchmarks/results/nothing.json", "langrt/nothing.py"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_figure_is_in_a_results_file_the_page_links(page):
    assert unfound_figures(page.read_text(), page.relative_to(ROOT).as_posix()) == [], (
        f"{page.name}: these figures are in no results file it links (benchmarks/results/*.json); "
        "quote the file's own numbers (python -m benchmarks.report), or link the file that holds them"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_link_or_repository_path_is_dangling(page):
    assert dangling_links(page.read_text(), page.parent) == []


def test_settings_exempted_are_still_on_their_pages():
    """An exemption whose figure left its page is stale: drop it, so it cannot hide a new figure."""
    stale = [(name, written) for name, written in SETTINGS if written not in {
        w for w, *_ in figures((ROOT / name).read_text())} ]  # fmt: skip
    assert stale == []


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160, "README.md is the front door: the guide lives in docs/"
    lines = [line.strip() for line in text.splitlines()]
    first_commands = [line for line in lines if line.startswith((".venv/", "./scripts/"))][:2]
    assert first_commands == [
        "./scripts/install.sh && .venv/bin/python examples/quickstart.py",
        ".venv/bin/python -m pytest -q",
    ]
