"""Imports point one way: the layer diagram in docs/architecture.md, checked on the source (ast).

Units are langrt's subpackages and top-level modules, and `langrt_kernels` (the repository's
kernels/ folder) as one. A unit may import units of its own layer or below; between units there
may be no cycle. There are no exceptions: a shared piece moves down a layer instead
(docs/architecture.md says where the last ones went).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Highest first. Same layer: allowed, cycles are not. `langrt` is the package's own __init__.
LAYERS = {
    "entrypoints": ["__main__", "cli", "doctor", "langrt", "router", "entrypoints", "engine"],
    "server": ["server"],
    "processes": ["processes"],
    "scheduler": ["scheduler", "detokenizer"],
    "components": ["speculative", "constrained", "mem", "model", "parallel", "lora", "sampling", "tokenizer",
                   "validation", "embeddings", "server_args", "messages", "ipc", "pickle_pipe", "builtin", "request"],
    "kernels": ["langrt_kernels"],
    # Standard library only; every layer, kernels included, reads settings and raises errors here.
    "foundation": ["envs", "errors", "cpu_features", "version", "child_setup"],
}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "kernels":
        parts[0] = "langrt_kernels"
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "langrt_kernels":
        return "langrt_kernels"
    if parts[0] != "langrt":
        return None
    return parts[1] if len(parts) > 1 else "langrt"


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # `from langrt import envs` imports langrt.envs, not the langrt package's __init__
            subs = {f"{base}.{alias.name}" for alias in node.names} & modules
            found |= subs or {base}
    return found


def unit_edges() -> dict[tuple[str, str], list[str]]:
    """(importer unit, imported unit) -> the 'module -> module' imports that make the arrow."""
    paths = {_module_name(p): p for folder in ("langrt", "kernels") for p in (ROOT / folder).rglob("*.py")}
    modules = set(paths)
    edges = defaultdict(list)
    for module, path in paths.items():
        for target in _imports(path, module, modules):
            a, b = _unit(module), _unit(target)
            if b is not None and a != b and (target in modules or target.split(".")[0] in ("langrt", "langrt_kernels")):
                edges[(a, b)].append(f"{module} -> {target}")
    return edges


def _rank() -> dict[str, int]:
    return {unit: -i for i, units in enumerate(LAYERS.values()) for unit in units}


def _cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one unit (Tarjan)."""
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_every_unit_has_a_layer():
    units = {u for edge in unit_edges() for u in edge}
    assert units - set(_rank()) == set(), "add the new package to LAYERS (and docs/architecture.md)"


def test_no_arrow_points_up_the_layers():
    rank = _rank()
    up = {e: why for e, why in unit_edges().items() if rank[e[0]] < rank[e[1]]}
    assert up == {}, f"imports against the layer diagram (docs/architecture.md): {up}"


def test_no_cycle_between_units():
    assert _cycles(set(unit_edges())) == []


def test_the_check_finds_a_cycle_and_an_upward_arrow():
    assert _cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    rank = _rank()
    assert rank["langrt_kernels"] < rank["constrained"] < rank["scheduler"] < rank["server"] < rank["engine"]
