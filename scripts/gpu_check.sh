#!/usr/bin/env bash
# The GPU path, end to end, on a machine with an NVIDIA GPU (and PyPI reachable):
#   1. installs vllm-omni with the `cuda` extra (vLLM's GPU build) into .venv-gpu,
#   2. builds the tiny checkpoint,
#   3. runs the parity suite and the vLLM backend tests with the vLLM stages on the GPU
#      (VLLM_OMNI_TEST_PLATFORM=cuda: the tests' engines take configs/qwen3_omni_tiny_gpu.yaml),
#   4. serves the tiny model with configs/qwen3_omni_tiny_gpu.yaml and runs
#      `vllm-omni bench realtime --sessions 1,8,32` against it,
# writing every log, the test report and the bench's results.json / table / plot under one
# folder. Aims at 10 minutes on one GPU; each step has its own time limit.
#
#   scripts/gpu_check.sh [--out DIR] [--dry-run]
#
# --dry-run prints the steps (and writes them to DIR/commands.txt) without running them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="gpu-check-$(date +%Y%m%d-%H%M%S)"
DRY_RUN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv-gpu"
BIN="$VENV/bin"
MODEL="$ROOT/.models/qwen3_omni_tiny"
CONFIG="configs/qwen3_omni_tiny_gpu.yaml"
PORT="${PORT:-8765}"
WAV="tests/data/speech_en_single.wav"
TESTS=(tests/test_pipeline_parity.py tests/test_vllm_backend.py tests/test_vllm_prefix_caching.py
       tests/test_vllm_talker_units.py)
export HF_HUB_OFFLINE=1 VLLM_OMNI_TEST_PLATFORM=cuda PYTHONUNBUFFERED=1

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
  for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then return 0; fi
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "gpu_check: the server exited" >&2; return 1; }
    sleep 1
  done
  echo "gpu_check: the server was not healthy after 300 s" >&2
  return 1
}

: >"$OUT/commands.txt"
if [ "$DRY_RUN" = 0 ]; then
  nvidia-smi >"$OUT/nvidia-smi.txt" || { echo "gpu_check: nvidia-smi failed: no NVIDIA GPU here?" >&2; exit 1; }
fi
[ -x "$BIN/python" ] || step venv 60 "$PYTHON" -m venv "$VENV"
step install 420 "$BIN/python" -m pip install -q -e ".[cuda,dev,bench]"
step tiny-model 120 "$BIN/vllm-omni" make-tiny-model --arch qwen3_omni_moe --out "$MODEL"
step tests 420 "$BIN/python" -m pytest -p no:cacheprovider --junitxml "$OUT/tests.xml" "${TESTS[@]}"

printf 'server: %s\n' "$BIN/vllm-omni serve $MODEL --deploy-config $CONFIG --port $PORT" | tee -a "$OUT/commands.txt"
if [ "$DRY_RUN" = 0 ]; then
  "$BIN/vllm-omni" serve "$MODEL" --deploy-config "$CONFIG" --host 127.0.0.1 --port "$PORT" \
    --served-model-name qwen3-omni-tiny >"$OUT/server.log" 2>&1 &
  SERVER_PID=$!
  trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true' EXIT
  wait_for_server
fi
step bench 300 "$BIN/vllm-omni" bench realtime --url "http://127.0.0.1:$PORT" --sessions 1,8,32 --turns 2 \
  --wav "$WAV" --out-dir "$OUT/bench" --no-baseline

if [ "$DRY_RUN" = 0 ]; then
  cat "$OUT/bench.log"
  echo "gpu_check: everything is in $OUT (tests.xml, bench/results.json, *.log)"
else
  echo "gpu_check: dry run; the steps are in $OUT/commands.txt"
fi
