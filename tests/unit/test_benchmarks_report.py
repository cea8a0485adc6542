"""`python -m benchmarks.report` on a tiny repository of its own: results older than the code
they measure are marked stale, results at the latest code current, files without a commit said
so; the table lands between the README's markers and nowhere else."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import report


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def result(commit: str | None, speedup: float) -> str:
    data = {"batches": {"1": {"speedup": speedup, "tok_s": 10.0}}, "no_reuse": {"cache_hit_rate": 0.01}}
    if commit:
        data["meta"] = {"commit": commit, "cpu": {"model": "Test CPU", "path_flags": ["avx2"]}}
    return json.dumps(data)


def make_repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    write(repo / "langrt" / "core.py", "x = 1\n")
    write(repo / "benchmarks" / "bench_x.py", "print('x')\n")
    write(
        repo / "benchmarks" / "README.md",
        f"# Benchmarks\n\nintro\n\n{report.BEGIN}\nold table\n{report.END}\n\nafter\n",
    )
    git(repo, "init", "-q")
    first = commit_all(repo, "first")
    write(repo / "langrt" / "core.py", "x = 2\n")
    second = commit_all(repo, "the runtime changes")
    write(repo / "docs" / "page.md", "words\n")
    commit_all(repo, "docs only: measured code unchanged")
    return repo, first, second


def test_results_older_than_their_code_are_marked_and_the_table_replaces_the_old(tmp_path):
    repo, first, second = make_repo(tmp_path)
    results = repo / "benchmarks" / "results"
    write(results / "bench_x.json", result(first, 1.5))
    write(results / "bench_x_new.json", result(second, 1.25))
    write(results / "bench_x_nometa.json", result(None, 2.0))
    rows = {r.name: r for r in report.collect(repo)}
    assert rows["bench_x"].status.startswith("stale: 1 later commit") and rows["bench_x"].benchmark == "bench_x"
    assert rows["bench_x_new"].status == "current", "a docs-only commit leaves it current"
    assert rows["bench_x_nometa"].status == "no commit recorded"
    assert rows["bench_x"].figures == ["batches.1.speedup: 1.50x", "no_reuse.cache_hit_rate: 1.0%"]
    assert rows["bench_x_new"].cpu == "Test CPU (avx2)"

    assert report.main([], repo=repo) == 0
    readme = (repo / "benchmarks" / "README.md").read_text()
    assert "old table" not in readme and readme.startswith("# Benchmarks\n\nintro\n") and readme.endswith("after\n")
    assert (
        f"| `results/bench_x.json` | bench_x | batches.1.speedup: 1.50x<br>no_reuse.cache_hit_rate: 1.0% | {first[:7]} |"
        in readme
    )
    assert "1 of 3 results current" in readme
    assert report.main(["--check"], repo=repo) == 0

    write(results / "bench_x_new.json", result(second, 1.75))
    assert report.main(["--check"], repo=repo) == 1, "a changed figure makes the table out of date"


def test_a_result_whose_script_changed_is_stale_and_an_unknown_commit_is_named(tmp_path):
    repo, _, second = make_repo(tmp_path)
    write(repo / "benchmarks" / "bench_x.py", "print('y')\n")
    commit_all(repo, "the benchmark changes")
    write(repo / "benchmarks" / "results" / "bench_x.json", result(second, 1.5))
    write(repo / "benchmarks" / "results" / "bench_x_elsewhere.json", result("f" * 40, 1.5))
    rows = {r.name: r for r in report.collect(repo)}
    assert rows["bench_x"].status.startswith("stale: 1 later commit")
    assert rows["bench_x_elsewhere"].status == "commit fffffff not in this repository"


def test_a_readme_without_markers_gets_the_table_appended():
    text = report.with_table("# B\n", "| t |")
    assert (
        text
        == f"# B\n\n## Results files\n\nWritten by `python -m benchmarks.report`.\n\n{report.BEGIN}\n| t |\n{report.END}\n"
    )


HEADLINES = (
    report.Headline("Speed", "bench_x_new", "{batches.1.tok_s:.1f} tok/s", "peer ({batches.1.speedup:.2f}x)"),
    report.Headline("Reuse", "bench_x_new", "{no_reuse.cache_hit_rate:.0%}"),
)


def test_the_front_page_table_is_filled_from_the_files_it_names(tmp_path, monkeypatch):
    repo, _, second = make_repo(tmp_path)
    write(repo / "benchmarks" / "results" / "bench_x_new.json", result(second, 1.25))
    write(repo / "README.md", f"# P\n\n{report.HEADLINE_BEGIN}\nhand-written\n{report.HEADLINE_END}\n\nend\n")
    monkeypatch.setattr(report, "HEADLINES", HEADLINES)
    assert report.main([], repo=repo) == 0
    readme = (repo / "README.md").read_text()
    assert "hand-written" not in readme and readme.startswith("# P\n\n") and readme.endswith("\n\nend\n")
    link = "[bench_x_new.json](benchmarks/results/bench_x_new.json)"
    assert f"| Speed | 10.0 tok/s | peer (1.25x) | {link} |" in readme
    assert f"| Reuse | 1% |  | {link} |" in readme
    assert f"- `bench_x_new.json`: commit {second[:7]}, Test CPU (avx2); current." in readme  # read once, listed once
    assert report.main(["--check"], repo=repo) == 0
    write(repo / "benchmarks" / "results" / "bench_x_new.json", result(second, 1.5))
    assert report.main(["--check"], repo=repo) == 1, "a changed figure makes the front page out of date"


def test_a_headline_naming_a_missing_figure_says_which():
    with pytest.raises(KeyError, match=r"results/f.json has no batches.2.tok_s"):
        report.fill("{batches.2.tok_s}", {"batches": {"1": {"tok_s": 1.0}}}, "f")


def test_a_headline_figure_may_be_scaled():
    assert report.fill("{a.b/1e3:.1f} kB, {a.c}", {"a": {"b": 2500, "c": 3}}, "f") == "2.5 kB, 3"
