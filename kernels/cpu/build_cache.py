"""Where langrt's CPU-kernel libraries are built, and found again by later processes.

Each library lives in a directory of its own, named by a key: the hash of its sources (every
.cpp and .h beside them), its compiler flags, the interpreter and the torch build. So two
checkouts or venvs with different sources each build once and never rebuild each other's; with
the same sources and torch they share one build. Under the key, each build runs in a fresh
`build-*` directory and is published, when complete, by atomically replacing `library.json`,
which names the library; a process loads only what that file names, so it never loads a library
while it is written or replaced. Builds take a BuildLock (build_lock.py): a killed build leaves
no lock that blocks, only its `build-*` directory (torch's own `lock` file inside it among the
leftovers), which the next build removes: under the lock no live build can own one. Compiler
processes orphaned by a killed build write into that dead directory only.

The root is torch's: $TORCH_EXTENSIONS_DIR, else torch's default (~/.cache/torch_extensions);
where that cannot be written, a per-user directory under the system's temporary directory.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from langrt_kernels.cpu.build_lock import BuildLock, Owner, read_owner

logger = logging.getLogger("langrt.kernels.cpu")

MARKER = "library.json"
LOCK = "build.lock"
TIMEOUT_ENV = "LANGRT_KERNEL_BUILD_TIMEOUT"
# A build takes 20 s to 2 min on 2 busy cores; a wait 5 times the slowest is a stuck builder.
DEFAULT_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class LibrarySpec:
    """One C++ library: its name (also the file's), sources and compiler flags."""

    name: str
    sources: tuple[Path, ...]
    cflags: tuple[str, ...]
    label: str  # for the log: "CPU kernels (avx2)"

    def key(self) -> str:
        digest = hashlib.sha256()
        folders = {path.parent for path in self.sources}
        inputs = sorted(set(self.sources) | {h for folder in folders for h in folder.glob("*.h")})
        for path in inputs:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        for part in (*self.cflags, *_toolchain()):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()[:16]


Compile = Callable[[LibrarySpec, Path], str]


def load(spec: LibrarySpec, compile_fn: Compile | None = None, timeout_s: float | None = None) -> Path:
    """Load the library into torch (its ops registered), building it first where no build of this
    key exists; the library's path. Raises what the build raises, or BuildLockTimeout."""
    import torch

    path = ensure_built(spec, compile_fn or _torch_compile, timeout_s)
    torch.ops.load_library(str(path))  # a no-op where the build just loaded it
    return path


def ensure_built(spec: LibrarySpec, compile_fn: Compile, timeout_s: float | None = None) -> Path:
    """The path of a complete build of `spec`, building it (under the lock) where there is none."""
    for directory in candidate_dirs(spec):
        if (path := built_library(directory)) is not None:
            return path
    directory = writable_dir(spec)
    timeout = timeout_s if timeout_s is not None else build_timeout()
    waiting = functools.partial(_log_wait, spec, directory / LOCK, timeout)
    with BuildLock(directory / LOCK, timeout, on_wait=waiting):
        return built_library(directory) or _build(spec, directory, compile_fn)


def build_timeout() -> float:
    """Seconds to wait for another process's build: $LANGRT_KERNEL_BUILD_TIMEOUT, else 600."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        return float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds") from None


def status(spec: LibrarySpec) -> str:
    """For `langrt doctor`: whether a build of `spec` exists and loads, and where; builds nothing."""
    import torch

    for directory in candidate_dirs(spec):
        if (path := built_library(directory)) is not None:
            try:
                torch.ops.load_library(str(path))
            except (OSError, RuntimeError) as exc:
                return f"built but does not load ({type(exc).__name__}: {str(exc).strip()[:200]}): {path}"
            return f"built, loads: {path}"
    directory = candidate_dirs(spec)[0]
    owner, _ = read_owner(directory / LOCK)
    if owner is not None and not owner.gone():
        return f"being built now by {owner.describe()}, into {directory}"
    return f"not built yet: first use builds it (20 s to 2 min) into {directory}; `python -m langrt_kernels.cpu` builds it now"


def built_library(directory: Path) -> Path | None:
    """The library that `directory`'s library.json names, where both exist."""
    try:
        record = json.loads((directory / MARKER).read_text())
        path = directory / record["library"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return path if path.is_file() else None


def candidate_dirs(spec: LibrarySpec) -> list[Path]:
    """The directories a build of `spec` may be in, in the order they are taken."""
    return [root / f"{spec.name}-{spec.key()}" for root in roots()]


def roots() -> list[Path]:
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    first = Path(env).absolute() if env else _torch_default_root()
    return [first / "langrt", Path(tempfile.gettempdir()) / f"langrt-torch-extensions-{os.getuid()}"]


def writable_dir(spec: LibrarySpec) -> Path:
    """The first candidate directory that can be made and written."""
    tried = []
    for directory in candidate_dirs(spec):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if os.access(directory, os.W_OK | os.X_OK):
                return directory
            tried.append(f"{directory} (not writable)")
        except OSError as exc:
            tried.append(f"{directory} ({exc.strerror})")
    raise OSError(f"no writable directory for the CPU kernels: tried {'; '.join(tried)}; set TORCH_EXTENSIONS_DIR to one")


def _build(spec: LibrarySpec, directory: Path, compile_fn: Compile) -> Path:
    _sweep(directory)
    attempt = Path(tempfile.mkdtemp(prefix="build-", dir=directory))
    started = time.monotonic()
    library = Path(compile_fn(spec, attempt))
    took = time.monotonic() - started
    record = {"library": str(library.relative_to(directory)), "seconds": round(took, 1), "built_by": dataclasses.asdict(Owner.me())}
    staged = directory / f"{MARKER}.{os.getpid()}"
    staged.write_text(json.dumps(record))
    os.replace(staged, directory / MARKER)  # published whole: readers see the old record or this one
    logger.info("built the %s in %.0f s (cached for later runs in %s)", spec.label, took, directory)
    return library


def _sweep(directory: Path) -> None:
    """Remove what killed builds left (their build-* directories, torch's `lock` files in them):
    the caller holds the lock, so no live build owns any of them."""
    for child in directory.iterdir():
        if child.is_dir() and child.name.startswith("build-"):
            logger.info("removing %s, left by a build that did not finish", child)
            shutil.rmtree(child, ignore_errors=True)


def _torch_compile(spec: LibrarySpec, build_dir: Path) -> str:
    from torch.utils import cpp_extension

    ninja_on_path()
    return cpp_extension.load(
        name=spec.name, sources=[str(path) for path in spec.sources], extra_cflags=list(spec.cflags),
        build_directory=str(build_dir), is_python_module=False, verbose=False,
    )  # fmt: skip


def ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the ninja package puts it next to this interpreter,
    which is not on PATH when the venv is not activated."""
    bin_dirs = [os.path.dirname(sys.executable)]
    try:
        import ninja

        bin_dirs.insert(0, ninja.BIN_DIR)
    except ImportError:
        pass
    os.environ["PATH"] = os.pathsep.join(bin_dirs + [os.environ.get("PATH", "")])


def _log_wait(spec: LibrarySpec, lock: Path, timeout: float, owner: Owner | None) -> None:
    holder = owner.describe() if owner is not None else "another process"
    logger.warning("waiting up to %.0f s for %s to finish building the %s (lock: %s)", timeout, holder, spec.label, lock)


@functools.cache
def _toolchain() -> tuple[str, ...]:
    import torch

    return (sys.version, platform.machine(), torch.__version__, str(torch.version.git_version), os.environ.get("CXX", ""))


def _torch_default_root() -> Path:
    from torch.utils import cpp_extension

    return Path(cpp_extension.get_default_build_root())
