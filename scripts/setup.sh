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
# torch: pyproject.toml admits a tested range; the exact version is pinned here (and in the
# Dockerfile), installed first so nothing pulls another build
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e "$spec"
# the CPU kernels (model/kernels/*.cpp) are compiled on first use; without a C++ compiler
# decoding still works, on slower PyTorch ops
if ! command -v c++ >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
  else
    echo "no C++ compiler (c++): install g++ for the fast CPU kernels; falling back to PyTorch ops" >&2
  fi
fi
.venv/bin/python -c "from model import kernels; kernels.load()"
