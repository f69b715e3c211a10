#!/usr/bin/env bash
# Set up (first run) and run the whole test suite, browser tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
if ! command -v chromium >/dev/null 2>&1; then
  # the browser tests drive Debian's Chromium (Playwright's own download does not work offline)
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install it (apt-get install chromium) to run the browser tests" >&2
  fi
fi
.venv/bin/ruff check .  # lint first: a finding fails the run
# -m "": every test, the kernels, browser and end-to-end ones too (a plain `pytest` leaves those out)
exec .venv/bin/python -m pytest -m "" "$@"
