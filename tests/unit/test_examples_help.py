"""Each example's `--help` says what it shows in whole sentences: its description is the module
docstring's first paragraph, not a line cut off mid-sentence. Fast: each example's `main(["--help"])`
runs in this process and exits before any model or server starts."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


def first_paragraph(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path.name} has no module docstring"
    return " ".join(doc.split("\n\n")[0].split())


def test_every_example_is_found():
    assert {p.stem for p in EXAMPLES} >= {"quickstart", "multi_step_analysis", "json_extraction"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_help_shows_the_whole_description(example, capsys):
    paragraph = first_paragraph(example)
    assert paragraph.endswith((".", ")")), f"{example.name}: the docstring's first paragraph is not a sentence"
    spec = importlib.util.spec_from_file_location(f"example_{example.stem}", example)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the main guard keeps the program itself from running
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert paragraph in " ".join(shown.split()), f"{example.name} --help cuts its description:\n{shown}"
