#!/usr/bin/env bash
# `ruff format --check` on the Python files given (default: every tracked one).
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF=${RUFF:-.venv/bin/ruff}
if [ "$#" -eq 0 ]; then set -- $(git ls-files '*.py'); fi
"$RUFF" format --check "$@"
