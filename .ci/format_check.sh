#!/usr/bin/env bash
# `ruff format --check` on the Python files given (default: every tracked one), except those in
# .ci/unformatted.txt: files not formatted yet, left for their owners to format when they next
# edit them (one tree-wide rewrite would collide with everyone's open work). The list only
# shrinks: delete a file's line once `ruff format FILE` has run on it. New files are checked.
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF=${RUFF:-.venv/bin/ruff}
if [ "$#" -eq 0 ]; then set -- $(git ls-files '*.py'); fi
printf '%s\n' "$@" | grep -vxF -f .ci/unformatted.txt | xargs -r "$RUFF" format --check
