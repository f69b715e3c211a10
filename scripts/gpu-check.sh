#!/usr/bin/env bash
# Everything that needs a GPU, in one run of under 8 minutes; all it measures goes to OUT_DIR.
#
#   bash scripts/gpu-check.sh OUT_DIR
#
# 1. the CUDA tests (tests/test_cuda.py: each CUDA path against its CPU twin)
# 2. the GPU table: ours in float16 and bfloat16 against Hugging Face generate (and CTranslate2 when
#    its wheel sees the GPU), beam 4 x batch 1/32/128, and a training throughput figure (bench/gpu.py)
# 3. the service on the GPU under load: 64 keep-alive clients for 20 s (bench/service.py)
#
# On the lent GPU machine (Python 3.12, torch with CUDA, transformers, sentencepiece, safetensors,
# httpx, prometheus-client; no network) the other packages come from artifacts/gpu-wheels, which
# scripts/gpu-wheels.sh fills here and the device run carries:
#   device run: command "bash scripts/gpu-check.sh \$OUT", carry ["artifacts/gpu-wheels"]
# They go into a virtual environment over the machine's own packages, so its torch stays.
#
# Without CUDA it says so, checks that each step would run (bench/gpu.py --check on the CPU, the
# CUDA tests collected, the service benchmark's options), and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/gpu-check.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_WAIT_POLICY=PASSIVE
status=0
step() {  # step NAME SECONDS COMMAND...: runs it with a deadline, its output in OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || { status=1; tail -20 "$OUT/$name.txt"; }
}

cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ "$cuda" != 1 ]; then
  echo "no CUDA device here: checking that the GPU check would run" | tee "$OUT/summary.txt"
  bash -n "$0" || status=1
  step bench-gpu-check 300 "$PY" bench/gpu.py --check --out "$OUT/bench-check"
  step cuda-tests-collected 120 "$PY" -m pytest -q --collect-only -m cuda tests/test_cuda.py
  step service-bench-options 60 "$PY" bench/service.py --help
  exit $status
fi

if [ -d artifacts/gpu-wheels ]; then
  "$PY" -m venv --system-site-packages /tmp/nmt-gpu-env && PY=/tmp/nmt-gpu-env/bin/python
  step install 180 "$PY" -m pip install --no-index --find-links artifacts/gpu-wheels fastapi "uvicorn[standard]" \
    pydantic pydantic-settings python-multipart polib sacrebleu pytest pytest-timeout redis
  "$PY" -m pip install -q --no-index --find-links artifacts/gpu-wheels ctranslate2 >/dev/null 2>&1 \
    || echo "ctranslate2: no wheel installed (the table leaves it out)" | tee -a "$OUT/summary.txt"
fi
{ nvidia-smi; "$PY" -c "import torch, sys; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } \
  >"$OUT/machine.txt" 2>&1
step cuda-tests 150 "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py
step bench-gpu 240 "$PY" bench/gpu.py --out "$OUT/bench"
step service-load 150 "$PY" bench/service.py --model checkpoints/en-de --device cuda --clients 64 --seconds 20 \
  --client raw --data training/examples.en --json "$OUT/service.json"
cat "$OUT/summary.txt"
exit $status
