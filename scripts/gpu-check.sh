#!/usr/bin/env bash
# Everything that needs a GPU, in one run of under 8 minutes; all it measures goes to OUT_DIR.
#
#   bash scripts/gpu-check.sh OUT_DIR
#
# 1. the CUDA tests (tests/test_cuda.py: each CUDA path against its CPU twin)
# 2. the GPU table: ours in float16 and bfloat16 (with CUDA graphs; in float16 also without them, and
#    with the host reading each step's flags while the next runs: ours-pipelined) against
#    Hugging Face generate (and CTranslate2 when its wheel sees the GPU), beam 4 x batch 1/32/128;
#    the shipped en-de's milliseconds per decoder step at batch 1 (graphs, pipelined, eager); a training
#    throughput figure (bench/gpu.py)
# 3. the service on the GPU under load (bench/service.py), 15 s each, one worker unless said, in
#    order of what the targets need, so that a run cut short keeps the first: as it ships (four
#    HTTP processes in front of the one engine, NMT_HTTP_PROCESSES=4: one process's ~1 ms of CPU a
#    request capped the last lease's service) at 64 keep-alive clients with the offline Translator
#    on the same sentences, and again with a hold after each batch of a closed loop for its
#    clients' next requests (NMT_BATCH_HOLD_MS=10, off by default: app/scheduler.py; without it
#    batches of 32 alternate), at 256, and at 64 with every request asking for alignments (the
#    bench's server without a client's quota of them); the same three with two workers on the
#    one GPU (NMT_WORKERS=2); at 64 with the graphed search pipelined
#    (NMT_PIPELINED_STEPS); then the running batch without the service against the Translator on
#    the same sentences, where its time goes, and its profile (bench/running.py); then running
#    batches in the service (NMT_RUNNING_BATCH=true, joining in groups of 8 or after 2 steps at 64
#    clients, 256 slots at 256) behind four HTTP processes (one HTTP process, which capped the last
#    lease's service, left out: the rows added since keep the whole run under 8 minutes in its place)
#
# On the lent GPU machine (Python 3.12, torch with CUDA, transformers, sentencepiece, safetensors,
# httpx, prometheus-client; no network) the other packages come from artifacts/gpu-wheels, which
# scripts/gpu-wheels.sh fills here and the device run carries:
#   device run: command "bash scripts/gpu-check.sh \$OUT/r; tar czf \$OUT/gpu-check.tar.gz -C \$OUT r",
#               carry ["artifacts/gpu-wheels"]   (a run brings back 8 files at most: one archive of all 11)
# They are unpacked (no dependencies resolved) into /tmp/nmt-gpu-site, after the machine's own packages on the path.
#
# GPU_CHECK_SKIP="bench-gpu service-256-p4 ..." leaves those steps out (a rerun within the same lease).
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
# lingua (language detection) does not travel to the GPU machine (scripts/gpu-wheels.sh); nothing here detects
export NMT_DETECT_LANGUAGES=none
status=0
step() {  # step NAME SECONDS COMMAND...: runs it with a deadline, its output in OUT/NAME.txt
  local name=$1 limit=$2
  case " ${GPU_CHECK_SKIP:-} " in *" $name "*) echo "$name: skipped" | tee -a "$OUT/summary.txt"; return;; esac
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
  step running-engine 300 "$PY" bench/running.py --model checkpoints/en-de --device cpu --sentences 48 --in-flight 16 \
    --slots 16 --kind fixed --batch-sizes 8,16
  exit $status
fi

if [ -d artifacts/gpu-wheels ]; then
  step install 120 "$PY" -m pip install --no-index --no-deps --no-compile --target /tmp/nmt-gpu-site artifacts/gpu-wheels/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/nmt-gpu-site"
  command -v redis-server >/dev/null || export PATH="$PATH:$PWD/artifacts/gpu-wheels/redis/bin"
fi
{ nvidia-smi; "$PY" -c "import torch, sys; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } \
  >"$OUT/machine.txt" 2>&1
step cuda-tests 150 "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py
step bench-gpu 240 "$PY" bench/gpu.py --out "$OUT/bench" --profile 128
service() {  # service NAME CLIENTS WORKERS [OPTIONS...]
  local name=$1 clients=$2 workers=$3
  shift 3
  step "$name" 120 env ${SERVICE_ENV:-} "$PY" bench/service.py --model checkpoints/en-de --device cuda --clients "$clients" \
    --workers "$workers" --seconds 15 --client raw --json "$OUT/$name.json" "$@"
}
# the service as it ships on a GPU machine first (four HTTP processes in front of one engine process
# and its one GPU worker: NMT_HTTP_PROCESSES 0 = 4 on a machine of 16 or more cores; the engine
# process keeps their store), so that a run cut short still has the targets' rows; then two workers
# on the GPU, the pipelined search, running batches
service service-64-p4 64 1 --http-processes 4
SERVICE_ENV=NMT_BATCH_HOLD_MS=10 service service-64-p4-hold 64 1 --http-processes 4 --no-offline
service service-256-p4 256 1 --http-processes 4 --no-offline
service service-64-alignments-p4 64 1 --alignments --http-processes 4 --no-offline
# two workers on the one GPU (NMT_WORKERS=2): one worker runs a batch at a time, each step a graph
# replay and a host sync, the GPU idle while the host works; the GPU
# time-slices between processes (their kernels never overlap), so a second process gains only
# what its kernels find of those idle gaps
service service-64-p4-w2 64 2 --http-processes 4 --no-offline
service service-256-p4-w2 256 2 --http-processes 4 --no-offline
service service-64-alignments-p4-w2 64 2 --alignments --http-processes 4 --no-offline
# the graphed search pipelined (NMT_PIPELINED_STEPS: the host reads a step's flags while the next runs)
SERVICE_ENV=NMT_PIPELINED_STEPS=true service service-64-p4-pipelined 64 1 --http-processes 4 --no-offline
step running-engine 150 "$PY" bench/running.py --model checkpoints/en-de --device cuda --sentences 2000 \
  --join 1:0 8:2 16:4 --batch-sizes 8,16,32,64,128 --profile "$OUT/running-profile.txt"
SERVICE_ENV="NMT_RUNNING_BATCH=true NMT_RUNNING_JOIN_GROUP=8 NMT_RUNNING_JOIN_WAIT=2" service service-64-running-p4 64 1 \
  --http-processes 4 --no-offline
SERVICE_ENV="NMT_RUNNING_BATCH=true NMT_RUNNING_SLOTS=256" service service-256-running-p4 256 1 --http-processes 4 --no-offline
cat "$OUT/summary.txt"
exit $status
