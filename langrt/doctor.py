"""`langrt doctor`: what a bug report needs, one `key: value` line each. It reads, builds nothing
and never fails: a part that cannot be asked says why on its own line."""

from __future__ import annotations

import platform
import sys
from typing import Callable

from langrt import envs

CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
CACHE_ENV = envs.DOCTOR_CACHES
SETTINGS_ENV = envs.DOCTOR_SETTINGS


def report() -> list[tuple[str, str]]:
    lines = [
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("platform", f"{platform.system()} {platform.machine()}"),
        ("langrt", _asked(_langrt_version)),
        ("torch", _asked(_torch_version)),
        ("transformers", _asked(_transformers_version)),
    ]
    lines += _cpu_lines()
    lines += [(name, envs.REGISTRY[name].raw() or "(unset)") for name in SETTINGS_ENV + CACHE_ENV]
    lines += [("extensions dir", _asked(_extensions_dir)), ("langrt cache dir", _asked(_langrt_cache_dir))]
    lines += [("hf hub cache", _asked(_hf_hub_cache)), ("built-in model", _asked(_builtin_model))]
    return lines


def run() -> int:
    for key, value in report():
        print(f"{key}: {value}")
    return 0


def _cpu_lines() -> list[tuple[str, str]]:
    from langrt.cpu_features import cpu_flags, torch_cpu_capability

    flags = cpu_flags()
    present = " ".join(f"{flag}={'yes' if flag in flags else 'no'}" for flag in CPU_FLAGS)
    return [
        ("cpu flags", present),
        ("torch cpu capability", _asked(torch_cpu_capability)),
        ("cpu path", _asked(_cpu_path)),
        ("prebuilt cpu kernels", _asked(_prebuilt_status)),
        ("cpu kernels", _asked(_kernels_status)),
        ("quantized cpu kernels", _asked(_quant_status)),
    ]


def _asked(question: Callable[[], str]) -> str:
    try:
        return str(question())
    except Exception as exc:  # noqa: BLE001 - a report of what is broken must not break itself
        return f"unknown ({type(exc).__name__}: {str(exc).strip()[:200]})"


def _langrt_version() -> str:
    from langrt.version import __version__

    return __version__


def _torch_version() -> str:
    import torch

    return f"{torch.__version__} (threads: {torch.get_num_threads()})"


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _cpu_path() -> str:
    import langrt_kernels.cpu as kernels_cpu

    return kernels_cpu.isa()


def _kernels_status() -> str:
    import langrt_kernels.cpu as kernels_cpu
    from langrt_kernels.cpu import build_cache

    reason = kernels_cpu.unavailable_reason()
    return f"off ({reason})" if reason else build_cache.status(kernels_cpu.library_spec(kernels_cpu.isa()))


def _prebuilt_status() -> str:
    """What the package shipped (a `pip install .` / wheel build with torch), or that it shipped none."""
    from langrt_kernels.cpu import build_sources

    records = build_sources.read_manifest()
    if records is None:
        return f"none shipped in {build_sources.PREBUILT_DIR} (a source checkout, an editable install or a build without torch: built on first use)"
    torch_versions = sorted({record.get("torch", "?") for record in records.values()})
    return f"{', '.join(sorted(records))} for torch {', '.join(torch_versions)}, in {build_sources.PREBUILT_DIR}"


def _quant_status() -> str:
    from langrt_kernels.cpu import build_cache, quant

    reason = quant.unavailable_reason()
    return f"off ({reason})" if reason else f"{quant.describe_isa()}; {build_cache.status(quant.library_spec())}"


def _extensions_dir() -> str:
    from langrt_kernels.cpu import build_cache

    return str(build_cache.roots()[0])


def _langrt_cache_dir() -> str:
    return str(envs.langrt_cache_dir())


def _hf_hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _builtin_model() -> str:
    from langrt.builtin import builtin_model_path

    return str(builtin_model_path())
