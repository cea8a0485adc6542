"""The shape the code keeps (issue 22): small modules and functions, and one owner of the KV
pools (mem.CacheManager), so the scheduler package never touches a pool."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("langrt", "langrt_frontend")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50


def _modules() -> list[Path]:
    modules = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(modules) > 50, "the packages were found"
    return modules


def test_no_module_over_400_lines():
    long = {
        str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_50_lines():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_scheduler_package_touches_no_pool():
    """Slots are asked for through CacheManager (langrt/mem/cache_manager.py), never taken from
    the pools: a name, attribute or import of either pool anywhere under langrt/scheduler/."""
    found = []
    for path in sorted((ROOT / "langrt" / "scheduler").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [alias.name.rsplit(".", 1)[-1] for alias in node.names]
            for name in names:
                if name in {"kv_pool", "req_pool", "TokenToKVPool", "ReqToTokenPool"}:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not found, f"the scheduler reaches into a pool: {found}"
