"""vLLM plugin entry point (`vllm.general_plugins` in pyproject.toml), run in every vLLM
process: registers our out-of-tree models with vLLM's model registry (by class path, so
nothing heavy is imported until vLLM builds the model), and MiniCPM-o's config and tokenizer
classes with transformers, so a MiniCPM-o folder loads without remote code."""

from __future__ import annotations

QWEN3_OMNI_TALKER = "Qwen3OmniTalkerForVllm"
QWEN3_OMNI_THINKER = "Qwen3OmniThinkerForVllm"
QWEN2_5_OMNI_THINKER = "Qwen25OmniThinkerForVllm"
MINICPMO_DUPLEX_THINKER = "MiniCPMODuplexThinkerForVllm"

OUT_OF_TREE_MODELS = {
    QWEN3_OMNI_TALKER: f"vllm_omni.models.qwen3_omni.vllm_backend.talker_model:{QWEN3_OMNI_TALKER}",
    QWEN3_OMNI_THINKER: f"vllm_omni.models.qwen3_omni.vllm_backend.thinker_model:{QWEN3_OMNI_THINKER}",
    QWEN2_5_OMNI_THINKER: f"vllm_omni.models.qwen2_5_omni.vllm_backend.thinker_model:{QWEN2_5_OMNI_THINKER}",
    MINICPMO_DUPLEX_THINKER: f"vllm_omni.models.minicpmo.vllm_model:{MINICPMO_DUPLEX_THINKER}",
}


def register() -> None:
    from vllm import ModelRegistry

    from vllm_omni.models.minicpmo.config import register_hf_classes
    from vllm_omni.models.minicpmo.tokenizer import register_tokenizer

    register_hf_classes()
    register_tokenizer()

    supported = ModelRegistry.get_supported_archs()
    for architecture, class_path in OUT_OF_TREE_MODELS.items():
        if architecture not in supported:
            ModelRegistry.register_model(architecture, class_path)
