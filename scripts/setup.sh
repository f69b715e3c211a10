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
# pip runs again only when pyproject.toml or this script changed, or for extras not installed
# yet (the install is editable: code changes need none); else a restart would spend ~20 s in pip
stamp=.venv/nmt-setup.stamp
wanted=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
installed_hash="" installed_extras=""
[ -f "$stamp" ] && read -r installed_hash installed_extras < "$stamp"
[ "$installed_extras" = "-" ] && installed_extras=""
missing=""
if [ "$installed_hash" = "$wanted" ]; then
  for extra in "$@"; do
    case ",$installed_extras," in *",$extra,"*) ;; *) missing="$missing $extra" ;; esac
  done
else
  installed_extras="" missing="all"
fi
if [ -n "$missing" ]; then
  # torch: pyproject.toml admits a tested range; the exact version is pinned here (and in the
  # Dockerfile), installed first so nothing pulls another build
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e "$spec"
  all_extras=$(echo "$installed_extras,$extras" | tr , '\n' | sed '/^$/d' | sort -u | paste -sd, -)
  echo "$wanted ${all_extras:--}" > "$stamp"
else
  echo "setup: .venv is up to date (pyproject.toml and scripts/setup.sh unchanged; extras: ${installed_extras:-none})" >&2
fi
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
