"""Where langrt's CPU-kernel libraries are found, or built and found again by later processes.

A package build (`pip install .`, a wheel: setup.py) compiles them ahead of time into
langrt_kernels/cpu/prebuilt/ with a manifest naming the sources' hash and the torch and Python
they were built for; a process loads that copy where it fits (prebuilt()), and otherwise, or with
$LANGRT_CPU_KERNELS_PREBUILT=0, builds on first use as below.

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

from langrt import envs
from langrt_kernels.cpu import build_sources
from langrt_kernels.cpu.build_lock import BuildLock, Owner, read_owner

logger = logging.getLogger("langrt.kernels.cpu")

MARKER = "library.json"
LOCK = "build.lock"
TIMEOUT_ENV = envs.LANGRT_KERNEL_BUILD_TIMEOUT.name
PREBUILT_ENV = envs.LANGRT_CPU_KERNELS_PREBUILT.name
# A build takes 20 s to 2 min on 2 busy cores; a wait 5 times the slowest is a stuck builder.
DEFAULT_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class LibrarySpec:
    """One C++ library: its name (also the file's), sources and compiler flags, and where a
    package build put its prebuilt copy (build_sources.PREBUILT_DIR; see prebuilt())."""

    name: str
    sources: tuple[Path, ...]
    cflags: tuple[str, ...]
    label: str  # for the log: "CPU kernels (avx2)"
    prebuilt_dir: Path = build_sources.PREBUILT_DIR

    def library(self) -> build_sources.Library:
        return build_sources.Library(self.name, self.sources, self.cflags)

    def key(self) -> str:
        digest = hashlib.sha256()
        self.library().hash_into(digest)
        for part in _toolchain():
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()[:16]


Compile = Callable[[LibrarySpec, Path], str]


def load(spec: LibrarySpec, compile_fn: Compile | None = None, timeout_s: float | None = None) -> Path:
    """Load the library into torch (its ops registered): the package's prebuilt copy where it
    ships one that fits (prebuilt()), else a build of this key, built first where there is none;
    the library's path. Raises what the build raises, or BuildLockTimeout."""
    import torch

    path, why_not = prebuilt(spec)
    if path is not None:
        why_not = _load_failure(path)
        if why_not is None:
            logger.info("%s: the package's prebuilt library %s", spec.label, path)
            return path
    shipped = spec.name in (build_sources.read_manifest(spec.prebuilt_dir) or {})  # then a build is news: say it louder
    logger.log(
        logging.WARNING if shipped else logging.INFO,
        "%s: no prebuilt library used (%s); built on first use",
        spec.label,
        why_not,
    )
    path = ensure_built(spec, compile_fn or _torch_compile, timeout_s)
    torch.ops.load_library(str(path))  # a no-op where the build just loaded it
    return path


def prebuilt(spec: LibrarySpec) -> tuple[Path | None, str]:
    """The library a package build shipped for `spec` (setup.py compiles build_sources'
    libraries ahead of time), or None and why it is not used: none shipped (a source checkout,
    an editable install, a build without torch), $LANGRT_CPU_KERNELS_PREBUILT=0, or one built
    from other sources or for another torch or Python."""
    if not envs.LANGRT_CPU_KERNELS_PREBUILT.get():
        return None, f"{PREBUILT_ENV}=0"
    records = build_sources.read_manifest(spec.prebuilt_dir)
    if records is None or spec.name not in records:
        return None, f"the package ships none in {spec.prebuilt_dir}"
    import torch

    record = records[spec.name]
    why_not = build_sources.prebuilt_mismatch(record, spec.library(), torch.__version__, str(torch.version.git_version))
    path = spec.prebuilt_dir / record["file"]
    if why_not is None and not path.is_file():
        why_not = f"{path} is missing"
    return (None, why_not) if why_not else (path, "")


def _load_failure(path: Path) -> str | None:
    """Load `path` into torch; None where it loaded, else why not, in one line."""
    import torch

    try:
        torch.ops.load_library(str(path))
        return None
    except (OSError, RuntimeError) as exc:
        return f"{path} does not load ({type(exc).__name__}: {str(exc).strip()[:200]})"


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
    return float(envs.LANGRT_KERNEL_BUILD_TIMEOUT.get())  # its default is DEFAULT_TIMEOUT_S


def status(spec: LibrarySpec) -> str:
    """For `langrt doctor`: which library of `spec` a process loads (the package's prebuilt one,
    or one built on first use), whether it loads, and where; builds nothing."""
    path, why_not = prebuilt(spec)
    if path is not None:
        why_not = _load_failure(path)
        if why_not is None:
            return f"prebuilt (shipped with the package), loads: {path}"
    return f"{_first_use_status(spec)} (no prebuilt library: {why_not})"


def _first_use_status(spec: LibrarySpec) -> str:
    for directory in candidate_dirs(spec):
        if (path := built_library(directory)) is not None:
            why_not = _load_failure(path)
            return f"built on first use, loads: {path}" if why_not is None else f"built on first use, but {why_not}"
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
    env = envs.TORCH_EXTENSIONS_DIR.get()
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
    raise OSError(
        f"no writable directory for the CPU kernels: tried {'; '.join(tried)}; set TORCH_EXTENSIONS_DIR to one"
    )


def _build(spec: LibrarySpec, directory: Path, compile_fn: Compile) -> Path:
    _sweep(directory)
    attempt = Path(tempfile.mkdtemp(prefix="build-", dir=directory))
    started = time.monotonic()
    library = Path(compile_fn(spec, attempt))
    took = time.monotonic() - started
    record = {
        "library": str(library.relative_to(directory)),
        "seconds": round(took, 1),
        "built_by": dataclasses.asdict(Owner.me()),
    }
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
        name=spec.name,
        sources=[str(path) for path in spec.sources],
        extra_cflags=list(spec.cflags),
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )


def ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the ninja package puts it next to this interpreter,
    which is not on PATH when the venv is not activated."""
    bin_dirs = [os.path.dirname(sys.executable)]
    try:
        import ninja

        bin_dirs.insert(0, ninja.BIN_DIR)
    except ImportError:
        pass
    envs.PATH.set(os.pathsep.join(bin_dirs + [str(envs.PATH.get())]))


def _log_wait(spec: LibrarySpec, lock: Path, timeout: float, owner: Owner | None) -> None:
    holder = owner.describe() if owner is not None else "another process"
    logger.warning(
        "waiting up to %.0f s for %s to finish building the %s (lock: %s)", timeout, holder, spec.label, lock
    )


@functools.cache
def _toolchain() -> tuple[str, ...]:
    import torch

    return (sys.version, platform.machine(), torch.__version__, str(torch.version.git_version), envs.CXX.raw() or "")


def _torch_default_root() -> Path:
    from torch.utils import cpp_extension

    return Path(cpp_extension.get_default_build_root())
