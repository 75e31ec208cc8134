#!/usr/bin/env bash
# The container's default command: build the tiny random-weight checkpoint on first start
# (it is made here, never downloaded), then serve it as `make serve` does, on every interface.
set -euo pipefail
MODEL="${TINY_MODEL:-/opt/vllm-omni/.models/qwen3_omni_tiny}"
[ -f "$MODEL/model.safetensors" ] || vllm-omni make-tiny-model --arch qwen3_omni_moe --out "$MODEL"
exec vllm-omni serve "$MODEL" --deploy-config configs/qwen3_omni_tiny_cpu.yaml --host 0.0.0.0 \
  --port "${PORT:-8000}" --served-model-name qwen3-omni-tiny "$@"
