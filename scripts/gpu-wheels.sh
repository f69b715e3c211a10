#!/usr/bin/env bash
# The wheels scripts/gpu-check.sh installs on the GPU machine, which has Python 3.12, torch with
# CUDA, transformers, sentencepiece, safetensors, httpx and prometheus-client, and no network.
# Run here (it reaches PyPI), then hand the folder to the device run:
#   bash scripts/gpu-wheels.sh            # -> artifacts/gpu-wheels (ignored by git; ~17 MB)
#   device run: command "bash scripts/gpu-check.sh \$OUT/r; tar czf \$OUT/gpu-check.tar.gz -C \$OUT r",
#               carry ["artifacts/gpu-wheels"]   (a run brings back 8 files at most: one archive of all 11)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-artifacts/gpu-wheels}
mkdir -p "$out"
PY=${PYTHON:-$(command -v .venv/bin/python || command -v python3)}
# Only what the machine lacks, without dependencies (the machine has the rest: anyio, click, h11,
# uvloop, lxml, pytest, pytest-timeout, sacrebleu, numpy, ...): the working tree (~54 MiB, mostly
# the shipped checkpoints) and the carried wheels share a device run's 64 MiB, so CTranslate2's
# 43 MB wheel and lingua's cannot travel (the table then leaves CTranslate2 out, and the check
# runs the service with language detection off).
rm -rf "$out" && mkdir -p "$out"
"$PY" -m pip download -q -d "$out" --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform linux_x86_64 \
  fastapi starlette opentelemetry-api pydantic pydantic-core pydantic-settings python-dotenv \
  typing-inspection annotated-types typing-extensions uvicorn httptools python-multipart polib redis orjson
# Debian's redis-server and redis-cli with the libraries they link (~9 MB), for the service rows
# with several HTTP processes, should the GPU machine lack them: each behind a wrapper that points
# the loader at its own libraries (redis-server is redis-check-rdb, which acts by the name it runs as)
if command -v redis-server >/dev/null; then
  mkdir -p "$out/redis/bin" "$out/redis/lib"
  for tool in redis-server redis-cli; do
    cp -L "$(command -v $tool)" "$out/redis/lib/$tool"
    ldd "$(command -v $tool)" | awk '/=> \//{print $3}' | grep -v -E "/(libc|libm|libstdc\+\+|libgcc_s)\.so" \
      | xargs -r cp -L -t "$out/redis/lib"
    printf '#!/bin/sh\nhere=$(dirname "$(readlink -f "$0")")/../lib\nLD_LIBRARY_PATH="$here" exec "$here/%s" "$@"\n' \
      "$tool" >"$out/redis/bin/$tool"
    chmod +x "$out/redis/bin/$tool"
  done
fi
du -sh "$out"
