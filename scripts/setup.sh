#!/usr/bin/env bash
# Create .venv (Python 3.11) and install the project; extras as arguments: bash scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
extras=$(IFS=,; echo "$*")
spec="."
[ -n "$extras" ] && spec=".[$extras]"
# torch is pinned (torch==2.13.0) in pyproject.toml; install it first so nothing pulls another build
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e "$spec"
