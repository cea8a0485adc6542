"""The `langrt` command line: flags generated from ServerArgs, and `generate` end to end."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from langrt.cli import build_parser, main, server_args_from
from langrt.server_args import ServerArgs


def test_every_server_arg_is_a_flag_with_its_default():
    ns = build_parser().parse_args(["generate", "hi"])
    assert server_args_from(ns) == ServerArgs()
    fields = {f.name for f in dataclasses.fields(ServerArgs)}
    assert fields <= set(vars(ns))


def test_flags_parse_to_typed_values():
    ns = build_parser().parse_args(["generate", "hi", "--max-total-tokens", "512", "--mem-fraction-static", "0.5",
                                    "--dtype", "float32"])  # fmt: skip
    args = server_args_from(ns)
    assert args.max_total_tokens == 512 and args.mem_fraction_static == 0.5 and args.dtype == "float32"


def test_bad_choice_is_refused():
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["generate", "hi", "--device", "tpu"])
    assert info.value.code == 2


def test_generate_prints_the_completion(tiny_llama_dir, capsys):
    code = main(["generate", "Hello", "--model-path", str(tiny_llama_dir), "--max-new-tokens", "5",
                 "--max-total-tokens", "256", "--dtype", "float32", "--log-level", "warning"])  # fmt: skip
    assert code == 0
    assert capsys.readouterr().out.strip() != ""


def test_bad_request_is_a_message_not_a_traceback(tiny_llama_dir, capsys):
    code = main(["generate", "Hello", "--model-path", str(tiny_llama_dir), "--max-new-tokens", "-3",
                 "--max-total-tokens", "256", "--log-level", "warning"])  # fmt: skip
    assert code == 2
    assert "max_new_tokens" in capsys.readouterr().err


def test_missing_model_path_is_a_message(tmp_path, capsys):
    assert main(["generate", "Hello", "--model-path", str(tmp_path / "nope")]) == 2
    assert "neither an HF model directory nor a .gguf file" in capsys.readouterr().err


def test_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "langrt", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "generate" in out.stdout


def test_doctor_prints_what_a_bug_report_needs(tmp_path):
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "LANGRT_CPU_ISA": "scalar"}
    done = subprocess.run(
        [sys.executable, "-m", "langrt.cli", "doctor"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    report = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    for key in ("python", "torch", "transformers", "cpu flags", "cpu path", "cpu kernels", "quantized cpu kernels",
                "extensions dir", "HF_HOME", "hf hub cache", "built-in model"):  # fmt: skip
        assert key in report, f"{key} missing from:\n{done.stdout}"
    assert report["cpu path"] == "scalar"  # LANGRT_CPU_ISA caps it
    assert all(f"{flag}=" in report["cpu flags"] for flag in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16"))
    assert report["extensions dir"] == str(tmp_path / "ext" / "langrt")
    assert (
        report["cpu kernels"].startswith("not built yet")
        and str(tmp_path / "ext" / "langrt" / "langrt_cpu_kernels_scalar-") in report["cpu kernels"]
    )
    assert not (tmp_path / "ext").exists() or not any((tmp_path / "ext").rglob("*.so"))  # it builds nothing
