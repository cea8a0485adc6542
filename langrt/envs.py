"""Every environment variable langrt reads, in one typed registry.

Each variable is an `EnvVar` (name, type, default, one-line doc); code reads it through the
variable's accessor (`envs.LANGRT_TP_SHM.get()`), never through `os.environ`, so this module is
the one place to learn what the environment can change. docs/configuration.md is generated from
`REGISTRY` (`markdown()`), `langrt doctor` prints the values, and tests/unit/test_envs.py checks
that no other module reads `os.environ` (the child-process launchers copy the environment whole to
pass it on, and are allowed to).

Values are read on every call, not cached at import: tests and `langrt` itself set variables after
import (`monkeypatch.setenv`, the AVX2 CI run) and expect the next read to see them.

This module imports only the standard library: `langrt_kernels` sits below langrt in the layer
diagram (docs/architecture.md) and still reads its settings here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Union

Value = Union[str, bool, float, None]


@dataclass(frozen=True)
class EnvVar:
    """One variable. `kind` is how `get()` reads the text:

    - "flag": on unless set to "0" (langrt's switches are all "=0 turns it off"); `default` is True.
    - "str": the text, or `default` where unset or empty.
    - "float": the text as a number, or `default` where unset or empty; other text raises ValueError
      naming the variable.
    """

    name: str
    kind: str
    default: Value
    doc: str
    owner: str = "langrt"  # "langrt", or the tool that defines it (torch, triton, ...) for variables langrt only reads

    def __post_init__(self) -> None:
        assert self.kind in ("flag", "str", "float"), f"{self.name}: unknown kind {self.kind!r}"

    def raw(self) -> str | None:
        """The text as set, or None where unset."""
        return os.environ.get(self.name)

    def get(self) -> Value:
        text = self.raw()
        if self.kind == "flag":
            return text != "0"
        if not text:
            return self.default
        if self.kind == "float":
            try:
                return float(text)
            except ValueError:
                raise ValueError(
                    f"{self.name}={text!r} is not a number; unset it or give one (e.g. {self.default})"
                ) from None
        return text

    def set(self, value: str) -> None:
        """Write the variable for this process and the children it starts (only where a library
        reads it from the environment and nowhere else: see the callers)."""
        os.environ[self.name] = value

    def setdefault(self, value: str) -> None:
        os.environ.setdefault(self.name, value)


def _var(name: str, kind: str, default: Value, doc: str, owner: str = "langrt") -> EnvVar:
    var = EnvVar(name, kind, default, doc, owner)
    REGISTRY[name] = var
    return var


REGISTRY: dict[str, EnvVar] = {}

# langrt's own switches.
LANGRT_CPU_KERNELS = _var(
    "LANGRT_CPU_KERNELS",
    "flag",
    True,
    "=0: none of langrt's C++ CPU kernels (layer, quantized, grammar) are built or used; torch runs instead.",
)
LANGRT_CPU_LAYER_KERNELS = _var(
    "LANGRT_CPU_LAYER_KERNELS",
    "flag",
    True,
    "=0: the layer kernels library off, the quantized products still on (for comparisons).",
)
LANGRT_CPU_ATTENTION_SEGMENTS = _var(
    "LANGRT_CPU_ATTENTION_SEGMENTS",
    "flag",
    True,
    "=0: the CPU paged_attention kernel takes long rows whole instead of in segments (for comparisons; read by the C++ kernel).",
)
LANGRT_CPU_FUSED_LAYERS = _var(
    "LANGRT_CPU_FUSED_LAYERS",
    "flag",
    True,
    "=0: decode runs layer by layer in Python instead of one fused C++ call over all layers.",
)
LANGRT_CPU_ISA = _var(
    "LANGRT_CPU_ISA",
    "str",
    "",
    "Caps the CPU kernels' instruction set: 'avx2' or 'scalar' (unset: the best this CPU runs).",
)
LANGRT_CPU_KERNELS_PREBUILT = _var(
    "LANGRT_CPU_KERNELS_PREBUILT",
    "flag",
    True,
    "=0: the package's prebuilt kernel libraries are ignored and built on first use.",
)
LANGRT_KERNEL_BUILD_TIMEOUT = _var(
    "LANGRT_KERNEL_BUILD_TIMEOUT",
    "float",
    600.0,
    "Seconds to wait for another process that is building the same kernel library.",
)
LANGRT_TP_SHM = _var(
    "LANGRT_TP_SHM",
    "flag",
    True,
    "=0: tensor-parallel CPU ranks all-reduce through gloo instead of shared memory.",
)
LANGRT_CACHE_DIR = _var(
    "LANGRT_CACHE_DIR",
    "str",
    None,
    "Where langrt keeps built grammar libraries (unset: ~/.cache/langrt).",
)

# Other tools' variables that langrt reads (or writes for them).
CXX = _var(
    "CXX",
    "str",
    "g++",
    "The C++ compiler for langrt's grammar library; part of the kernel build key.",
    "make",
)
TORCH_EXTENSIONS_DIR = _var(
    "TORCH_EXTENSIONS_DIR",
    "str",
    None,
    "Where the CPU kernel libraries are built on first use (unset: torch's default).",
    "torch",
)
ATEN_CPU_CAPABILITY = _var(
    "ATEN_CPU_CAPABILITY",
    "str",
    None,
    "Caps torch's CPU ISA (e.g. avx2); langrt then gives torch.compile a cache of its own for it.",
    "torch",
)
TORCHINDUCTOR_CACHE_DIR = _var(
    "TORCHINDUCTOR_CACHE_DIR",
    "str",
    None,
    "torch.compile's cache; set by langrt (per ISA) only where ATEN_CPU_CAPABILITY is set and you chose none.",
    "torch",
)
TRITON_INTERPRET = _var(
    "TRITON_INTERPRET",
    "str",
    None,
    "=1: Triton kernels run in the interpreter; needed for --attention-backend triton on CPU.",
    "triton",
)
GLOO_SOCKET_IFNAME = _var(
    "GLOO_SOCKET_IFNAME",
    "str",
    None,
    "The interface gloo binds; langrt sets 'lo' for CPU tensor parallelism where unset.",
    "torch",
)
PATH = _var(
    "PATH",
    "str",
    "",
    "langrt puts the ninja package's folder and the interpreter's on it before building kernels.",
    "os",
)

# Read by `langrt doctor` only, to put them in a bug report.
for _name, _owner, _doc in (
    ("ONEDNN_MAX_CPU_ISA", "oneDNN", "Caps oneDNN's ISA (e.g. AVX2)."),
    ("OMP_NUM_THREADS", "OpenMP", "Threads torch's CPU ops use."),
    ("HF_HOME", "huggingface", "Hugging Face's home folder."),
    ("HF_HUB_CACHE", "huggingface", "Where downloaded models are cached."),
    ("TRANSFORMERS_CACHE", "huggingface", "transformers' older cache setting."),
    ("HF_HUB_OFFLINE", "huggingface", "=1: no downloads."),
):
    _var(_name, "str", None, _doc + " Reported by `langrt doctor`.", _owner)

# What `langrt doctor` prints, in this order.
DOCTOR_SETTINGS = (
    "LANGRT_CPU_ISA",
    "LANGRT_CPU_KERNELS",
    "LANGRT_CPU_KERNELS_PREBUILT",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "OMP_NUM_THREADS",
)
DOCTOR_CACHES = (
    "TORCH_EXTENSIONS_DIR",
    "LANGRT_CACHE_DIR",
    "HF_HOME",
    "HF_HUB_CACHE",
    "TRANSFORMERS_CACHE",
    "HF_HUB_OFFLINE",
)


def langrt_cache_dir() -> Path:
    """$LANGRT_CACHE_DIR, else ~/.cache/langrt."""
    return Path(LANGRT_CACHE_DIR.get() or Path.home() / ".cache" / "langrt")


def cpu_isa_cap() -> str:
    """$LANGRT_CPU_ISA lowered ('' where unset)."""
    return str(LANGRT_CPU_ISA.get()).lower()


def markdown() -> str:
    """docs/configuration.md, generated: tests/unit/test_envs.py checks the page matches."""
    lines = [
        "# Configuration: environment variables",
        "",
        "Generated from `langrt/envs.py` by `python -m langrt.envs > docs/configuration.md`; a test",
        "fails when this page and the registry differ. Command-line flags are in `langrt launch --help`;",
        "these variables are the settings that live outside it. `langrt doctor` prints their values.",
        "",
        "Flags are on unless set to `0`.",
        "",
        "| Variable | Type | Default | Owner | What it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for var in REGISTRY.values():
        default = "(unset)" if var.default in (None, "") else str(var.default)
        lines.append(f"| `{var.name}` | {var.kind} | {default} | {var.owner} | {var.doc} |")
    return "\n".join(lines) + "\n"


def help_epilog() -> str:
    """The langrt variables, one line each, for `langrt launch --help`."""
    own = [var for var in REGISTRY.values() if var.owner == "langrt"]
    return "environment variables (docs/configuration.md):\n" + "\n".join(f"  {v.name}: {v.doc}" for v in own)


if __name__ == "__main__":
    print(markdown(), end="")
