"""What the CPU-kernel libraries are built from: one list, read by setup.py (which compiles them
ahead of time into a wheel) and by the run-time loader (which finds those prebuilt libraries, or
builds on first use what is not shipped). A new kernel source is built everywhere by being listed
here, or, for the quantized library, by being named `quant*.cpp`.

Also the record a package build writes beside its libraries (`prebuilt/manifest.json`), and the
check that a shipped library was built from these very sources and flags, for this torch.

Only the standard library, and no imports from the package: setup.py loads this file by its path,
before anything is installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PREBUILT_DIR = HERE / "prebuilt"
MANIFEST = "manifest.json"
LAYER_SOURCES = ("paged_attention.cpp", "layer_ops.cpp", "fused_layers.cpp")
# Per ISA: the library's name, its op namespace, and the instructions the build targets (exactly
# these, so it runs on any CPU that has them).
LAYER_ISAS = {
    "avx512": ("langrt_cpu_kernels", "langrt_cpu", ("-mavx512f", "-mfma")),
    "avx2": ("langrt_cpu_kernels_avx2", "langrt_cpu_avx2", ("-mavx2", "-mfma")),
    "scalar": ("langrt_cpu_kernels_scalar", "langrt_cpu_scalar", ("-DLANGRT_CPU_SCALAR",)),
}
# -fopenmp: at::parallel_for is a no-op without it. -ffp-contract=off: a product and a sum written
# apart stay apart (rounded as torch rounds them), never fused into one FMA behind our back. The
# quantized library takes no -m flags: its AVX2 functions carry their instruction set themselves.
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
QUANT_NAME = "langrt_cpu_quant"


@dataclasses.dataclass(frozen=True)
class Library:
    """One C++ library: its name (also its file's stem), sources and compiler flags."""

    name: str
    sources: tuple[Path, ...]
    cflags: tuple[str, ...]

    def digest(self) -> str:
        """The hash of the sources, every header beside them and the flags: what the library is."""
        digest = hashlib.sha256()
        self.hash_into(digest)
        return digest.hexdigest()[:16]

    def hash_into(self, digest) -> None:
        """Feed the sources, every header beside them and the flags into `digest` (a hashlib object)."""
        folders = {path.parent for path in self.sources}
        inputs = sorted(set(self.sources) | {h for folder in folders for h in folder.glob("*.h")})
        for path in inputs:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        for flag in self.cflags:
            digest.update(flag.encode() + b"\0")


def layer_library(isa: str, folder: Path = HERE) -> Library:
    """The layer kernels (attention, fused norms, rotary, SiLU-and-mul) for 'avx512', 'avx2' or 'scalar'."""
    name, namespace, isa_flags = LAYER_ISAS[isa]
    flags = CFLAGS + isa_flags + (f"-DLANGRT_CPU_NS={namespace}",)
    return Library(name, tuple(folder / source for source in LAYER_SOURCES), flags)


def quant_sources(folder: Path = HERE) -> tuple[Path, ...]:
    """Every quant*.cpp: a new quantized kernel's file is built by being named so."""
    return tuple(sorted(folder.glob("quant*.cpp")))


def quant_library(folder: Path = HERE) -> Library:
    """The quantized matrix products (one library for every CPU: see quant.py)."""
    return Library(QUANT_NAME, quant_sources(folder), CFLAGS)


def shipped_libraries(machine: str | None = None, only: tuple[str, ...] = ()) -> list[Library]:
    """What a package build compiles for `machine` (default: this one): on x86-64 the layer
    kernels for each ISA (the CPU that runs the wheel picks one), elsewhere the plain-C++ build;
    and the quantized library. `only` keeps just the named ISAs (a build for one machine)."""
    x86 = (machine or platform.machine()) in ("x86_64", "AMD64")
    isas = ("avx512", "avx2", "scalar") if x86 else ("scalar",)
    unknown = set(only) - set(isas)
    if unknown:
        raise ValueError(f"unknown ISA {sorted(unknown)} for this machine: choose from {', '.join(isas)}")
    return [layer_library(isa) for isa in isas if not only or isa in only] + [quant_library()]


def toolchain(torch_version: str, torch_git: str) -> dict[str, str]:
    """What a prebuilt library must share with the process that loads it: its C++ ABI is torch's
    (a library built against one torch release may not load, or misbehave, under another)."""
    return {
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "machine": platform.machine(),
        "torch": torch_version,
        "torch_git": torch_git,
    }


def manifest_entry(library: Library, file_name: str, torch_version: str, torch_git: str) -> dict[str, str]:
    return {"name": library.name, "file": file_name, "digest": library.digest(), **toolchain(torch_version, torch_git)}


def write_manifest(directory: Path, entries: list[dict[str, str]]) -> Path:
    path = Path(directory) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"libraries": entries}, indent=1) + "\n")
    return path


def read_manifest(directory: Path = PREBUILT_DIR) -> dict[str, dict[str, str]] | None:
    """The prebuilt libraries' records by name; None where the package shipped none."""
    try:
        records = json.loads((Path(directory) / MANIFEST).read_text())["libraries"]
        return {record["name"]: record for record in records}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prebuilt_mismatch(record: dict[str, str], library: Library, torch_version: str, torch_git: str) -> str | None:
    """Why the shipped library `record` describes cannot stand for `library` here; None where it can."""
    if record.get("digest") != library.digest():
        return "its sources or flags differ from these (edited since the package was built)"
    expected = toolchain(torch_version, torch_git)
    for key, value in expected.items():
        if record.get(key) != value:
            return f"it was built for {key} {record.get(key)}, this process runs {value}"
    return None
