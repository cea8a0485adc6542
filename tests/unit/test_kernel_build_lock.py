"""The CPU kernels' build lock and keyed build directories (issue 48): a killed build never blocks
a later one, a live one is waited on for a bounded time, two source trees never share a build.
No compiler here: the builds are stand-ins that write a file."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from langrt_kernels.cpu import build_cache, build_sources
from langrt_kernels.cpu.build_cache import LibrarySpec
from langrt_kernels.cpu.build_lock import BuildLock, BuildLockTimeout, Owner


@pytest.fixture
def spec(tmp_path, monkeypatch) -> LibrarySpec:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    sources = tmp_path / "src"
    sources.mkdir()
    (sources / "a.cpp").write_text("int a() { return 1; }\n")
    (sources / "a.h").write_text("int a();\n")
    return LibrarySpec("fake_lib", (sources / "a.cpp",), ("-O3",), "fake kernels")


def fake_compile(calls: list):
    def compile_fn(spec: LibrarySpec, build_dir: Path) -> str:
        calls.append(build_dir)
        library = build_dir / f"{spec.name}.so"
        library.write_text("binary")
        return str(library)

    return compile_fn


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def hold_flock(path: Path, owner: Owner) -> int:
    """Another holder of the lock (a second open file: flocks conflict even within one process)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, owner.dumps().encode())
    return fd


def test_a_live_holder_is_waited_on_then_the_wait_ends_with_a_clear_error(tmp_path):
    lock = tmp_path / "build.lock"
    fd = hold_flock(lock, Owner.me())
    waits = []
    started = time.monotonic()
    with pytest.raises(BuildLockTimeout) as info:
        BuildLock(lock, timeout_s=0.5, poll_s=0.05, on_wait=waits.append).acquire()
    assert 0.5 <= time.monotonic() - started < 5
    assert len(waits) == 1 and waits[0].pid == os.getpid()
    message = str(info.value)
    assert str(lock) in message and f"pid {os.getpid()}" in message and f"kill {os.getpid()}" in message
    assert "LANGRT_CPU_KERNELS=0" in message and "\n" not in message
    os.close(fd)
    with BuildLock(lock, timeout_s=0.5):  # released with its holder
        assert Owner.parse(lock.read_text()).pid == os.getpid()
    assert not lock.exists()


def test_a_lock_left_by_a_killed_process_does_not_block(tmp_path):
    lock = tmp_path / "build.lock"
    lock.write_text(Owner("h", dead_pid(), "", time.time()).dumps())  # the file stays, its flock went with its owner
    with BuildLock(lock, timeout_s=0.5, on_wait=lambda owner: pytest.fail("waited")):
        assert Owner.parse(lock.read_text()).pid == os.getpid()


def test_a_held_lock_whose_owner_is_gone_is_broken(tmp_path):
    import socket

    lock = tmp_path / "build.lock"
    fd = hold_flock(lock, Owner(socket.gethostname(), dead_pid(), "", time.time()))  # kept by, say, a forked child
    started = time.monotonic()
    with BuildLock(lock, timeout_s=5, poll_s=0.05):
        assert Owner.parse(lock.read_text()).pid == os.getpid()
    assert time.monotonic() - started < 2
    os.close(fd)


def test_an_owner_on_another_host_is_never_taken_for_gone():
    assert not Owner("some-other-host", dead_pid(), "", time.time()).gone()
    assert Owner(Owner.me().host, dead_pid(), "", time.time()).gone()
    me = Owner.me()
    assert not me.gone()
    assert Owner(me.host, me.pid, "1", me.since).gone()  # the pid now belongs to a newer process


def test_built_once_then_loaded_from_the_record(spec):
    calls = []
    first = build_cache.ensure_built(spec, fake_compile(calls))
    again = build_cache.ensure_built(spec, fake_compile(calls))
    assert first == again and len(calls) == 1
    directory = build_cache.candidate_dirs(spec)[0]
    assert directory.parent == Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "langrt"
    assert json.loads((directory / "library.json").read_text())["library"] == str(first.relative_to(directory))
    assert not (directory / "build.lock").exists()


def test_leftovers_of_a_killed_build_and_torchs_lock_are_removed(spec):
    directory = build_cache.candidate_dirs(spec)[0]
    killed = directory / "build-killed"
    killed.mkdir(parents=True)
    (killed / "lock").write_text("")  # torch's FileBaton, which its killed owner never removed
    (directory / "build.lock").write_text(Owner("h", dead_pid(), "", time.time()).dumps())
    calls = []
    started = time.monotonic()
    library = build_cache.ensure_built(spec, fake_compile(calls))
    assert time.monotonic() - started < 2 and len(calls) == 1
    assert not killed.exists() and library.is_file()


def test_sources_headers_flags_each_change_the_key(spec, tmp_path):
    key = spec.key()
    assert LibrarySpec(spec.name, spec.sources, ("-O2",), spec.label).key() != key
    (tmp_path / "src" / "a.h").write_text("int a(); // edited\n")
    assert spec.key() != key
    other = tmp_path / "checkout2"
    other.mkdir()
    for name in ("a.cpp", "a.h"):
        (other / name).write_text((tmp_path / "src" / name).read_text())
    assert (
        LibrarySpec(spec.name, (other / "a.cpp",), spec.cflags, spec.label).key() == spec.key()
    )  # same sources: one build


def test_two_source_trees_alternate_without_rebuilding(spec, tmp_path):
    other = tmp_path / "checkout2"
    other.mkdir()
    (other / "a.cpp").write_text("int a() { return 2; }\n")
    spec2 = LibrarySpec(spec.name, (other / "a.cpp",), spec.cflags, spec.label)
    calls = []
    paths = [build_cache.ensure_built(s, fake_compile(calls)) for s in (spec, spec2, spec, spec2)]
    assert len(calls) == 2 and paths[0] == paths[2] and paths[1] == paths[3] and paths[0] != paths[1]


def test_an_unwritable_root_falls_back_to_the_temporary_directory(spec, tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # no directory can be made under it, even by root
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(blocked / "ext"))
    monkeypatch.setattr(build_cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    library = build_cache.ensure_built(spec, fake_compile([]))
    assert library.is_relative_to(tmp_path / "tmp")


def test_a_failed_build_publishes_nothing(spec):
    def failing(spec, build_dir):
        raise RuntimeError("g++: not found")

    with pytest.raises(RuntimeError, match="g\\+\\+"):
        build_cache.ensure_built(spec, failing)
    assert build_cache.built_library(build_cache.candidate_dirs(spec)[0]) is None
    assert build_cache.ensure_built(spec, fake_compile([])).is_file()


def test_the_wait_is_set_by_its_variable(monkeypatch):
    monkeypatch.delenv(build_cache.TIMEOUT_ENV, raising=False)
    assert build_cache.build_timeout() == build_cache.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(build_cache.TIMEOUT_ENV, "2.5")
    assert build_cache.build_timeout() == 2.5
    monkeypatch.setenv(build_cache.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="LANGRT_KERNEL_BUILD_TIMEOUT='soon'"):
        build_cache.build_timeout()


def test_a_timed_out_wait_reaches_the_caller_as_one_clear_reason(spec):
    from langrt_kernels.cpu import build_failure

    directory = build_cache.writable_dir(spec)
    fd = hold_flock(directory / build_cache.LOCK, Owner.me())
    reason = build_failure(lambda: build_cache.ensure_built(spec, fake_compile([]), timeout_s=0.3))
    os.close(fd)
    assert reason.startswith("could not build it (BuildLockTimeout: waited 0.3 s for the lock ")
    assert str(directory / build_cache.LOCK) in reason and reason.endswith("runs without the kernels)")


def test_status_says_whether_a_build_exists_is_under_way_or_neither(spec):
    directory = build_cache.candidate_dirs(spec)[0]
    assert build_cache.status(spec).startswith(f"not built yet: first use builds it (20 s to 2 min) into {directory}")
    directory.mkdir(parents=True)
    (directory / build_cache.LOCK).write_text(Owner(Owner.me().host, dead_pid(), "", time.time()).dumps())
    assert build_cache.status(spec).startswith("not built yet")  # a killed build's record
    fd = hold_flock(directory / build_cache.LOCK, Owner.me())
    assert build_cache.status(spec).startswith(f"being built now by pid {os.getpid()}")
    os.close(fd)


def ship(spec: LibrarySpec, tmp_path: Path, **changes) -> tuple[LibrarySpec, Path]:
    """`spec` as a package build ships it: a library file and its manifest entry (fields `changes`d)."""
    import dataclasses

    import torch

    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    library = prebuilt / f"{spec.name}.cpython-311-x86_64-linux-gnu.so"
    library.write_text("binary")
    entry = build_sources.manifest_entry(
        spec.library(), library.name, torch.__version__, str(torch.version.git_version)
    )
    build_sources.write_manifest(prebuilt, [{**entry, **changes}])
    return dataclasses.replace(spec, prebuilt_dir=prebuilt), library


def test_a_shipped_library_is_taken_when_built_from_these_sources_for_this_torch(spec, tmp_path, monkeypatch):
    monkeypatch.delenv(build_cache.PREBUILT_ENV, raising=False)
    shipped, library = ship(spec, tmp_path)
    assert build_cache.prebuilt(shipped) == (library, "")
    monkeypatch.setenv(build_cache.PREBUILT_ENV, "0")
    assert build_cache.prebuilt(shipped) == (None, f"{build_cache.PREBUILT_ENV}=0")


def test_a_shipped_library_of_other_sources_or_another_torch_is_not_taken(spec, tmp_path, monkeypatch):
    monkeypatch.delenv(build_cache.PREBUILT_ENV, raising=False)
    assert build_cache.prebuilt(spec)[1] == f"the package ships none in {build_sources.PREBUILT_DIR}"
    shipped, library = ship(spec, tmp_path, torch="2.0.0")
    path, why = build_cache.prebuilt(shipped)
    assert path is None and why.startswith("it was built for torch 2.0.0, this process runs ")
    (tmp_path / "prebuilt" / build_sources.MANIFEST).unlink()
    library.unlink()
    (tmp_path / "prebuilt").rmdir()
    shipped, library = ship(spec, tmp_path)
    spec.sources[0].write_text("int a() { return 2; }\n")  # edited after the package was built
    assert build_cache.prebuilt(shipped) == (
        None,
        "its sources or flags differ from these (edited since the package was built)",
    )


def test_status_says_a_shipped_library_that_does_not_load_and_what_is_used_instead(spec, tmp_path, monkeypatch):
    monkeypatch.delenv(build_cache.PREBUILT_ENV, raising=False)
    shipped, library = ship(spec, tmp_path)  # a text file: dlopen refuses it
    status = build_cache.status(shipped)
    assert status.startswith("not built yet: first use builds it")
    assert f"(no prebuilt library: {library} does not load (" in status


def test_the_layer_and_quantized_libraries_take_their_sources_from_one_list():
    import langrt_kernels.cpu as kernels_cpu
    from langrt_kernels.cpu import quant

    shipped = {library.name: library for library in build_sources.shipped_libraries("x86_64")}
    assert sorted(shipped) == [
        "langrt_cpu_kernels",
        "langrt_cpu_kernels_avx2",
        "langrt_cpu_kernels_scalar",
        "langrt_cpu_quant",
    ]
    assert [library.name for library in build_sources.shipped_libraries("aarch64")] == [
        "langrt_cpu_kernels_scalar",
        "langrt_cpu_quant",
    ]
    for isa in ("avx512", "avx2", "scalar"):
        assert kernels_cpu.library_spec(isa).library() == shipped[kernels_cpu.LIBRARIES[isa][0]]
    assert quant.library_spec().library() == shipped["langrt_cpu_quant"]
    on_disk = {path.name for path in build_sources.HERE.glob("quant*.cpp")}
    assert {path.name for path in shipped["langrt_cpu_quant"].sources} == on_disk and "quant_linear.cpp" in on_disk
