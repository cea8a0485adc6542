"""Every Python snippet of the README runs as written, as a plain script with no main guard.

Each is saved as a file and run with `python file.py` (the Engine one also through `python -`
and `python -c`): langrt's child processes must never import the user's main module, which
would re-run the script's top level (or find no file at all for `python -`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from server_utils import LaunchedServer

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def snippet(first_line: str) -> str:
    found = [s for s in python_snippets() if s.startswith(first_line)]
    assert len(found) == 1, f"the README has {len(found)} python snippets starting with {first_line!r}"
    return found[0]


def run_script(tmp_path, code: str, how: str = "file") -> str:
    """Run `code` as a user would; its stdout (the run must succeed)."""
    if how == "file":
        script = tmp_path / "snippet.py"
        script.write_text(code)
        command, stdin = [sys.executable, str(script)], None
    elif how == "stdin":
        command, stdin = [sys.executable, "-"], code
    else:
        command, stdin = [sys.executable, "-c", code], None
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, f"python {how} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


def test_every_python_snippet_is_covered():
    """A new snippet needs a test here: each one is matched by its first line."""
    firsts = sorted(s.splitlines()[0] for s in python_snippets())
    assert firsts == ["from langrt.constrained import GrammarCompiler", "import langrt", "import langrt_frontend as sgl", "import openai"]


def test_grammar_snippet(tmp_path):
    lines = run_script(tmp_path, snippet("from langrt.constrained import GrammarCompiler")).split()
    assert lines == ["False", "True", "False"]  # schema order by default; any order on request; never invalid


@pytest.mark.parametrize("how", ["file", "stdin", "command"])
def test_engine_snippet(tmp_path, how):
    out = run_script(tmp_path, snippet("import langrt\n"), how)
    assert "Paris" in out
    assert "'completion_tokens': 8" in out


def test_program_snippet(tmp_path):
    lines = run_script(tmp_path, snippet("import langrt_frontend as sgl")).strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        person, employed = line.rsplit(" ", 1)
        person = json.loads(person)
        assert set(person) == {"name", "age"} and isinstance(person["age"], int)
        assert employed in ("yes", "no")


def test_openai_snippet(tmp_path):
    server = LaunchedServer()
    try:
        code = snippet("import openai").replace("127.0.0.1:30000", f"127.0.0.1:{server.port}")
        assert f":{server.port}/v1" in code
        lines = run_script(tmp_path, code).strip().splitlines()
        name, arguments = lines[-1].split(" ", 1)
        assert name == "get_weather" and isinstance(json.loads(arguments)["city"], str)
    finally:
        server.stop()
