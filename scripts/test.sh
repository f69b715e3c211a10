#!/usr/bin/env bash
# Set up (first run) and run the whole test suite, browser tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
# the browser tests drive Debian's Chromium (Playwright's own download does not work offline); the
# scale-out tests start Debian's redis-server and nginx
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing="$missing nginx"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "missing:$missing (apt-get install$missing): their tests are skipped" >&2
  fi
fi
.venv/bin/ruff check .  # lint first: a finding fails the run
# Build the C++ kernels now (minutes in a fresh checkout), so that no test that starts a worker
# spends its readiness deadline compiling them; without a compiler the tests run on PyTorch ops.
.venv/bin/python -c "from model import kernels; print('CPU kernels:', 'built' if kernels.load() else 'unavailable')"
# -m "": every test, the kernels, browser and end-to-end ones too (a plain `pytest` leaves those out)
exec .venv/bin/python -m pytest -m "" "$@"
