#!/usr/bin/env bash
# The wheels scripts/gpu-check.sh installs on the GPU machine, which has Python 3.12, torch with
# CUDA, transformers, sentencepiece, safetensors, httpx and prometheus-client, and no network.
# Run here (it reaches PyPI), then hand the folder to the device run:
#   bash scripts/gpu-wheels.sh            # -> artifacts/gpu-wheels (ignored by git; ~60 MB)
#   device run: command "bash scripts/gpu-check.sh \$OUT", carry ["artifacts/gpu-wheels"]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-artifacts/gpu-wheels}
mkdir -p "$out"
PY=${PYTHON:-$(command -v .venv/bin/python || command -v python3)}
# what the service, the tests and the benchmarks import beyond the machine's packages; torch and
# CUDA are there already, so nothing here may pull them in. The file formats' readers are left
# out (the GPU check translates no files), and numpy, which the machine has: a device run carries
# at most 64 MiB.
rm -rf "$out" && mkdir -p "$out"
"$PY" -m pip download -q -d "$out" --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform linux_x86_64 \
  fastapi "uvicorn[standard]" pydantic pydantic-settings python-multipart polib "sacrebleu>=2.4" \
  pytest pytest-timeout redis ctranslate2
rm -f "$out"/numpy-*.whl "$out"/PyYAML-*.whl "$out"/pyyaml-*.whl
du -sh "$out"
