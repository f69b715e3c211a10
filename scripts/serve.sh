#!/usr/bin/env bash
# Set up (first run) and serve the shipped en-de and de-en models on http://127.0.0.1:8000 (extra args go to `nmt serve`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/nmt serve "$@"
