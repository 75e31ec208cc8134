"""vLLM's own Qwen2.5-Omni thinker, with Qwen3-Omni's fix to its multimodal processor
(qwen3_omni/vllm_backend/thinker_model.py: a prompt with precomputed audio features and an
image); registered by `vllm_omni.models.vllm_plugin`, served through `hf_overrides`."""

from __future__ import annotations

from vllm.model_executor.models.qwen2_5_omni_thinker import (
    Qwen2_5OmniThinkerDummyInputsBuilder,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen2_5OmniThinkerMultiModalProcessor,
    Qwen2_5OmniThinkerProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY

from vllm_omni.models.qwen3_omni.vllm_backend.thinker_model import ProcessedItemsOnly


class Qwen25OmniThinkerProcessor(ProcessedItemsOnly, Qwen2_5OmniThinkerMultiModalProcessor):
    pass


@MULTIMODAL_REGISTRY.register_processor(Qwen25OmniThinkerProcessor, info=Qwen2_5OmniThinkerProcessingInfo,
                                        dummy_inputs=Qwen2_5OmniThinkerDummyInputsBuilder)
class Qwen25OmniThinkerForVllm(Qwen2_5OmniThinkerForConditionalGeneration):
    pass
