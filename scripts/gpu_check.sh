#!/usr/bin/env bash
# The GPU path, end to end, on a machine with an NVIDIA GPU, in one of two modes.
#
# Full (default; PyPI reachable), about 10 minutes:
#   1. installs vllm-omni with the `cuda` extra (vLLM's GPU build) into .venv-gpu,
#   2. builds the tiny checkpoint,
#   3. runs the parity suite and the vLLM backend tests with the vLLM stages on the GPU
#      (VLLM_OMNI_TEST_PLATFORM=cuda: the tests' engines take configs/qwen3_omni_tiny_gpu.yaml),
#   4. serves the tiny model with configs/qwen3_omni_tiny_gpu.yaml and runs
#      `vllm-omni bench realtime --sessions 1,8,32` against it.
#
# Offline (--offline WHEELS; no network, no vLLM), under 8 minutes. The machine must already
# have Python 3.12 with torch 2.11 (CUDA 13) and transformers 5.17 in its site-packages;
# WHEELS is the folder scripts/gpu_wheels.sh builds on a machine with PyPI (the project's
# wheel and the few packages requirements/gpu-offline.txt lists, under 60 MB):
#   1. creates .venv-gpu-offline with --system-site-packages (the preinstalled torch and
#      transformers are used) and installs from WHEELS with --no-index: the listed packages,
#      resolved against what is installed, then the project with --no-deps,
#   2. prints the versions and the GPU torch sees (and fails when it sees none),
#   3. builds the tiny checkpoint,
#   4. runs the parity suite (tests/test_pipeline_parity.py) with every torch stage and
#      transformers' reference on the GPU (VLLM_OMNI_TEST_TORCH_DEVICE=cuda; tests that need
#      vLLM skip: VLLM_OMNI_TEST_PLATFORM=none),
#   5. serves the tiny model with configs/qwen3_omni_tiny_gpu_torch.yaml (every stage on torch
#      on GPU 0) and runs `vllm-omni bench realtime --sessions 1,8,32` against it.
#
# Either way every log, the test report and the bench's results.json / table / plot land in
# one folder, and each step has its own time limit.
#
#   scripts/gpu_check.sh [--offline WHEELS] [--out DIR] [--dry-run]
#
# --dry-run prints the steps (and writes them to DIR/commands.txt) without running them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="gpu-check-$(date +%Y%m%d-%H%M%S)"
DRY_RUN=0
WHEELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --offline) WHEELS="$(realpath -m "$2")"; shift 2 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

PYTHON="${PYTHON:-python3}"
MODEL="$ROOT/.models/qwen3_omni_tiny"
PORT="${PORT:-8765}"
WAV="tests/data/speech_en_single.wav"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -z "$WHEELS" ]; then
  VENV="$ROOT/.venv-gpu"
  CONFIG="configs/qwen3_omni_tiny_gpu.yaml"
  TESTS=(tests/test_pipeline_parity.py tests/test_vllm_backend.py tests/test_vllm_prefix_caching.py
         tests/test_vllm_talker_units.py)
  TINY_S=120 TESTS_S=420 HEALTH_S=300 BENCH_S=300
  export VLLM_OMNI_TEST_PLATFORM=cuda
else
  VENV="$ROOT/.venv-gpu-offline"
  CONFIG="configs/qwen3_omni_tiny_gpu_torch.yaml"
  TESTS=(tests/test_pipeline_parity.py)
  TINY_S=30 TESTS_S=120 HEALTH_S=30 BENCH_S=180  # with the install's 105 s: 465 s at most
  export VLLM_OMNI_TEST_PLATFORM=none VLLM_OMNI_TEST_TORCH_DEVICE=cuda
fi
BIN="$VENV/bin"

# `step NAME SECONDS CMD...`: run CMD with a time limit, its output in $OUT/NAME.log.
step() {
  local name="$1" limit="$2"
  shift 2
  printf '%s (limit %ss): %s\n' "$name" "$limit" "$*" | tee -a "$OUT/commands.txt"
  [ "$DRY_RUN" = 1 ] && return 0
  local began=$SECONDS
  if ! timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
    echo "gpu_check: step $name failed after $((SECONDS - began)) s; see $OUT/$name.log" >&2
    tail -n 30 "$OUT/$name.log" >&2
    return 1
  fi
  echo "  done in $((SECONDS - began)) s"
}

wait_for_server() {
  for _ in $(seq 1 "$HEALTH_S"); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then return 0; fi
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "gpu_check: the server exited" >&2; return 1; }
    sleep 1
  done
  echo "gpu_check: the server was not healthy after $HEALTH_S s" >&2
  return 1
}

: >"$OUT/commands.txt"
if [ "$DRY_RUN" = 0 ]; then
  nvidia-smi >"$OUT/nvidia-smi.txt" || { echo "gpu_check: nvidia-smi failed: no NVIDIA GPU here?" >&2; exit 1; }
  if [ -n "$WHEELS" ] && ! ls "$WHEELS"/vllm_omni-*.whl >/dev/null 2>&1; then
    echo "gpu_check: no vllm_omni wheel in $WHEELS (build the folder with scripts/gpu_wheels.sh)" >&2
    exit 1
  fi
fi
if [ -z "$WHEELS" ]; then
  [ -x "$BIN/python" ] || step venv 60 "$PYTHON" -m venv "$VENV"
  step install 420 "$BIN/python" -m pip install -q -e ".[cuda,dev,bench]"
else
  [ -x "$BIN/python" ] || step venv 20 "$PYTHON" -m venv --system-site-packages "$VENV"
  step install-deps 45 "$BIN/python" -m pip install -q --no-index --find-links "$WHEELS" \
    -r requirements/gpu-offline.txt
  step install 20 "$BIN/python" -m pip install -q --no-index --find-links "$WHEELS" --no-deps --force-reinstall \
    vllm-omni
  step versions 20 "$BIN/python" -c "import sys, torch, transformers; print(sys.version, torch.__version__, \
torch.version.cuda, transformers.__version__); print(torch.cuda.get_device_name(0))"
fi
step tiny-model "$TINY_S" "$BIN/vllm-omni" make-tiny-model --arch qwen3_omni_moe --out "$MODEL"
step tests "$TESTS_S" "$BIN/python" -m pytest -p no:cacheprovider --junitxml "$OUT/tests.xml" "${TESTS[@]}"

printf 'server (limit %ss): %s\n' "$HEALTH_S" "$BIN/vllm-omni serve $MODEL --deploy-config $CONFIG --port $PORT" |
  tee -a "$OUT/commands.txt"  # the limit is its time to become healthy
if [ "$DRY_RUN" = 0 ]; then
  "$BIN/vllm-omni" serve "$MODEL" --deploy-config "$CONFIG" --host 127.0.0.1 --port "$PORT" \
    --served-model-name qwen3-omni-tiny >"$OUT/server.log" 2>&1 &
  SERVER_PID=$!
  trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true' EXIT
  wait_for_server
fi
step bench "$BENCH_S" "$BIN/vllm-omni" bench realtime --url "http://127.0.0.1:$PORT" --sessions 1,8,32 --turns 2 \
  --wav "$WAV" --out-dir "$OUT/bench" --no-baseline

if [ "$DRY_RUN" = 0 ]; then
  cat "$OUT/bench.log"
  echo "gpu_check: everything is in $OUT (tests.xml, bench/results.json, *.log)"
else
  echo "gpu_check: dry run; the steps are in $OUT/commands.txt"
fi
