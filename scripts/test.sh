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
# -m "": every test, the kernels, browser and end-to-end ones too (a plain `pytest` leaves those out)
exec .venv/bin/python -m pytest -m "" "$@"
