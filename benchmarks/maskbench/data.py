"""MaskBench's data as cases: sampling schemas across sources, serialising and tokenizing instances.

MaskBench (maskbench/data of github.com/guidance-ai/jsonschemabench) is ~11k files
`<source>---<name>.json` (BFCL and JME ones: `BFCL_simple_12.json`, `JME_3.json`), each
{"description", "meta", "schema", "tests": [{"description", "valid", "data"}, ...]}; about 13%
have no tests. The repository states no licence: nothing of it is copied into this project.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

Encode = Callable[[str], list[int]]


@dataclass(frozen=True)
class Instance:
    valid: bool
    text: str
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    schema: Any
    instances: tuple[Instance, ...]

    def __post_init__(self):
        assert self.instances, f"{self.id}: a case has instances"


def serialise(data: Any) -> str:
    """An instance as MaskBench's runner writes it: json.dumps(data, indent=None,
    ensure_ascii=False), i.e. one line with ", " and ": " separators, keys in the data's order."""
    return json.dumps(data, indent=None, ensure_ascii=False)


def source_of(path: Path) -> str:
    """MaskBench's split of a file: `Github_easy---o10008.json` -> Github_easy,
    `BFCL_simple_12.json` -> BFCL_simple, `JME_3.json` -> JME."""
    stem = path.stem
    return stem.split("---")[0] if "---" in stem else re.sub(r"_\d+$", "", stem)


def quotas(sizes: dict[str, int], n: int, rng: random.Random) -> dict[str, int]:
    """`n` schemas split across sources: one each, the rest in proportion to their sizes
    (largest remainders first). With fewer than one per source, `n` sources drawn at random."""
    sources = sorted(sizes)
    if n < len(sources):
        return {s: 1 for s in rng.sample(sources, n)}
    total = sum(sizes.values())
    shares = {s: 1 + (n - len(sources)) * sizes[s] / total for s in sources}
    counts = {s: int(shares[s]) for s in sources}
    for s in sorted(sources, key=lambda s: counts[s] - shares[s])[: n - sum(counts.values())]:
        counts[s] += 1
    return counts


def sample_cases(data: Path, n: int, seed: int, encode: Encode) -> list[Case]:
    """`n` schemas with instances, spread across the data's sources (see `quotas`), each source's
    files taken in a seeded order; fewer where the data has fewer. Shuffled, so a run's progress
    spreads across sources."""
    by_source: dict[str, list[Path]] = {}
    for path in sorted(data.glob("*.json")):
        by_source.setdefault(source_of(path), []).append(path)
    if not by_source:
        raise SystemExit(f"no MaskBench files (*.json) in {data}; --data takes the maskbench/data folder")
    rng = random.Random(seed)
    cases = []
    for source, count in sorted(quotas({s: len(p) for s, p in by_source.items()}, n, rng).items()):
        paths = by_source[source][:]
        rng.shuffle(paths)
        cases += _first_with_tests(paths, count, encode)
    rng.shuffle(cases)
    return cases


def _first_with_tests(paths: list[Path], count: int, encode: Encode) -> list[Case]:
    cases = []
    for path in paths:
        if len(cases) == count:
            break
        if (case := load_case(path, encode)) is not None:
            cases.append(case)
    return cases


def load_case(path: Path, encode: Encode) -> Case | None:
    """One MaskBench file as a Case (its instances serialised and tokenized); None if it has none."""
    content = json.loads(path.read_text())
    instances = tuple(
        Instance(test["valid"], text, tuple(encode(text)))
        for test in content.get("tests") or []
        for text in [serialise(test["data"])]
    )
    return Case(path.stem, source_of(path), content["schema"], instances) if instances else None
