"""benchmarks/check_llama_cpp.py, the check of langrt's logits against llama.cpp's on the same
GGUF file: its bounds and its distance (the check itself needs llama-cpp-python and runs as that
script, which exits 2 rather than pass where it is missing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import check_llama_cpp  # noqa: E402


def test_the_bounds_fail_a_distant_or_shifted_result():
    ok = check_llama_cpp.Distances("p", 10, blocks=0.04, dequantized=0.041)
    assert ok.passed
    assert not check_llama_cpp.Distances("p", 10, blocks=0.07, dequantized=0.07).passed
    assert not check_llama_cpp.Distances("p", 10, blocks=0.04, dequantized=0.03).passed


def test_the_distance_is_relative_per_position_then_averaged():
    theirs = torch.tensor([[3.0, 4.0], [0.0, 2.0]])
    ours = torch.tensor([[3.0, 4.5], [0.0, 2.0]])  # 0.5 / 5 at the first position, 0 at the second
    assert check_llama_cpp.relative_distance(ours, theirs) == pytest.approx(0.05)
