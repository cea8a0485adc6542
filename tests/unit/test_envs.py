"""langrt/envs.py: the one registry of environment variables, its typed reads, its generated page,
and that no other module reads os.environ."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from langrt import envs

ROOT = Path(__file__).resolve().parents[2]
# Modules that may touch os.environ: the registry, and the launchers that copy the environment
# whole into the child processes they start.
ALLOWED = {"langrt/envs.py", "langrt/processes/launcher.py", "langrt/router/replicas.py"}


def test_only_the_registry_and_the_launchers_read_the_environment():
    pattern = re.compile(r"os\.environ|os\.getenv|os\.putenv")
    found = {
        str(path.relative_to(ROOT))
        for folder in ("langrt", "kernels")
        for path in (ROOT / folder).rglob("*.py")
        if pattern.search(path.read_text())
    }
    assert found - ALLOWED == set(), "read the variable through langrt.envs (add it to REGISTRY) instead"


def test_the_configuration_page_matches_the_registry():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == envs.markdown(), "regenerate it: python -m langrt.envs > docs/configuration.md"


def test_every_langrt_variable_named_in_the_code_is_registered():
    names = set()
    for folder in ("langrt", "kernels"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".cpp", ".h"):
                names |= set(re.findall(r"\"(LANGRT_[A-Z0-9_]+)\"", path.read_text()))
    assert names - set(envs.REGISTRY) == set()


def test_a_flag_is_on_unless_set_to_zero(monkeypatch):
    monkeypatch.delenv("LANGRT_TP_SHM", raising=False)
    assert envs.LANGRT_TP_SHM.get() is True
    monkeypatch.setenv("LANGRT_TP_SHM", "0")
    assert envs.LANGRT_TP_SHM.get() is False
    monkeypatch.setenv("LANGRT_TP_SHM", "1")
    assert envs.LANGRT_TP_SHM.get() is True


def test_a_number_reads_its_default_and_names_bad_text(monkeypatch):
    monkeypatch.delenv("LANGRT_KERNEL_BUILD_TIMEOUT", raising=False)
    assert envs.LANGRT_KERNEL_BUILD_TIMEOUT.get() == 600.0
    monkeypatch.setenv("LANGRT_KERNEL_BUILD_TIMEOUT", "")
    assert envs.LANGRT_KERNEL_BUILD_TIMEOUT.get() == 600.0
    monkeypatch.setenv("LANGRT_KERNEL_BUILD_TIMEOUT", "2.5")
    assert envs.LANGRT_KERNEL_BUILD_TIMEOUT.get() == 2.5
    monkeypatch.setenv("LANGRT_KERNEL_BUILD_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="LANGRT_KERNEL_BUILD_TIMEOUT='soon'"):
        envs.LANGRT_KERNEL_BUILD_TIMEOUT.get()


def test_the_cache_dir_and_isa_cap(monkeypatch, tmp_path):
    monkeypatch.setenv("LANGRT_CACHE_DIR", str(tmp_path))
    assert envs.langrt_cache_dir() == tmp_path
    monkeypatch.delenv("LANGRT_CACHE_DIR")
    assert envs.langrt_cache_dir() == Path.home() / ".cache" / "langrt"
    monkeypatch.setenv("LANGRT_CPU_ISA", "AVX2")
    assert envs.cpu_isa_cap() == "avx2"


def test_launch_help_lists_the_variables():
    from langrt.cli import build_parser

    launch = build_parser()._subparsers._group_actions[0].choices["launch"]
    text = launch.format_help()
    assert all(name in text for name, var in envs.REGISTRY.items() if var.owner == "langrt")
