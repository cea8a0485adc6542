"""docs/architecture.md names only modules that exist, and its module map covers every package of
langrt/.

A path counts when it is backticked, starts with one of the repository's top-level folders
below, and ends in `.py` (a module) or `/` (a package or folder). Fast: reads text files only.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"

PREFIXES = ("langrt/", "langrt_frontend/", "kernels/", "benchmarks/", "tests/", "examples/", "docs/", "scripts/")
_BACKTICKED = re.compile(r"`([^`\n]+)`")


def module_paths(text: str) -> list[str]:
    """Backticked spans that look like a module (`.py`) or package (`/`) path, in order."""
    spans = (span.strip() for span in _BACKTICKED.findall(text))
    return [s for s in spans if s.startswith(PREFIXES) and s.endswith((".py", "/")) and " " not in s]


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """The module paths of `text` with nothing at that path under `root`."""
    missing = []
    for path in module_paths(text):
        target = root / path
        exists = target.is_dir() if path.endswith("/") else target.is_file()
        if not exists:
            missing.append(path)
    return missing


def module_map(page: str) -> str:
    """The page's "## Module map" section, up to the next heading of that level."""
    match = re.search(r"^## Module map\s*$(.*?)(?=^## |\Z)", page, flags=re.M | re.S)
    assert match, "docs/architecture.md has no '## Module map' section"
    return match.group(1)


def langrt_packages(root: Path = ROOT) -> list[str]:
    """Every package below langrt/ (a directory with __init__.py), as `langrt/a/b/`."""
    return sorted(
        init.parent.relative_to(root).as_posix() + "/"
        for init in (root / "langrt").rglob("__init__.py")
        if init.parent != root / "langrt"
    )


def test_architecture_doc_names_existing_modules():
    text = ARCHITECTURE.read_text()
    assert len(module_paths(text)) > 20, "docs/architecture.md should name the modules it describes"
    assert missing_paths(text) == []


def test_module_map_names_existing_modules():
    section = module_map(ARCHITECTURE.read_text())
    assert module_paths(section), "the module map names no paths"
    assert missing_paths(section) == []


def test_module_map_covers_every_langrt_package():
    mentioned = set(module_paths(module_map(ARCHITECTURE.read_text())))
    packages = langrt_packages()
    assert "langrt/scheduler/" in packages  # the walk found the tree
    assert [p for p in packages if p not in mentioned] == []
