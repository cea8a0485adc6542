"""Every Python snippet of the README (and of the guide pages that show runnable code) runs as
written, as a plain script with no main guard, and prints what the page says it prints.

Each is saved as a file and run with `python file.py` (the Engine one also through `python -`
and `python -c`): langrt's child processes must never import the user's main module, which
would re-run the script's top level (or find no file at all for `python -`). The shown outputs
are the built-in model's greedy ones, so they are compared exactly.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from server_utils import LaunchedServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SERVING = ROOT / "docs" / "serving.md"
STRUCTURED = ROOT / "docs" / "structured_outputs.md"
DEFAULT_URL = "127.0.0.1:30000"


def python_snippets(page: Path = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def snippet(first_line: str, page: Path = README) -> str:
    found = [s for s in python_snippets(page) if s.startswith(first_line)]
    assert len(found) == 1, f"{page.name} has {len(found)} python snippets starting with {first_line!r}"
    return found[0]


def shown_after(code: str) -> str:
    """The output a snippet's page shows: the comment on its last print line."""
    last_print = [line for line in code.splitlines() if line.startswith("print(")][-1]
    return last_print.split("  # ", 1)[1].strip()


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


@pytest.fixture(scope="module")
def server():
    launched = LaunchedServer()
    yield launched
    launched.stop()


def on(server, code: str) -> str:
    assert DEFAULT_URL in code
    return code.replace(DEFAULT_URL, f"127.0.0.1:{server.port}")


def test_every_python_snippet_is_covered():
    """A new snippet needs a test here: each one is matched by its first line."""
    assert sorted(s.splitlines()[0] for s in python_snippets()) == [
        "import json",
        "import langrt_frontend as sgl",
        "import openai",
    ]
    assert sorted(s.splitlines()[0] for s in python_snippets(SERVING)) == ["import langrt", "import openai"]
    assert [s.splitlines()[0] for s in python_snippets(STRUCTURED)] == [
        "from langrt.constrained import GrammarCompiler"
    ]


def test_program_snippet_prints_what_the_readme_shows(tmp_path):
    shown = re.search(r"It prints[^\n]*\n\n```text\n(.*?)```", README.read_text(), flags=re.S)
    assert shown, "the README shows the program's output in a text block after 'It prints'"
    assert run_script(tmp_path, snippet("import langrt_frontend as sgl")) == shown.group(1)


def test_openai_snippet_prints_what_the_readme_shows(tmp_path, server):
    code = snippet("import openai")
    assert run_script(tmp_path, on(server, code)).strip() == shown_after(code)


def test_response_format_snippet_prints_what_the_readme_shows(tmp_path, server):
    code = snippet("import json")
    assert "response_format" in code
    printed = run_script(tmp_path, on(server, code)).strip()
    assert ast.literal_eval(printed) == ast.literal_eval(shown_after(code))


def test_tool_call_snippet(tmp_path, server):
    lines = run_script(tmp_path, on(server, snippet("import openai", SERVING))).strip().splitlines()
    name, arguments = lines[-1].split(" ", 1)
    assert name == "get_weather" and isinstance(json.loads(arguments)["city"], str)


def test_grammar_snippet(tmp_path):
    lines = run_script(tmp_path, snippet("from langrt.constrained import GrammarCompiler", STRUCTURED)).split()
    assert lines == ["False", "True", "False"]  # schema order by default; any order on request; never invalid


@pytest.mark.parametrize("how", ["file", "stdin", "command"])
def test_engine_snippet(tmp_path, how):
    out = run_script(tmp_path, snippet("import langrt\n", SERVING), how)
    assert "Paris" in out
    assert "'completion_tokens': 8" in out


def test_multi_step_example_gives_each_step_its_own_text(server):
    """A small model asked a follow-up tends to repeat its last answer; the example's steps must
    each say something of their own, even in a --quick run."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "multi_step_analysis.py"), "--quick", "--url", server.url],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    steps = re.findall(r"^== (\w+) \(.*?\)\n(.*?)\n\n", done.stdout, flags=re.M | re.S)
    assert [name for name, _ in steps] == ["key_points", "analysis", "summary"], done.stdout
    assert len({text.strip() for _, text in steps}) == 3, done.stdout
