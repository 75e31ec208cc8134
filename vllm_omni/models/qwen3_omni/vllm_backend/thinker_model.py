"""vLLM's own Qwen3-Omni thinker, with one fix to its multimodal processor (registered by
`vllm_omni.models.vllm_plugin`; the thinker engine serves it through `hf_overrides`).

vLLM 0.32 hands the Hugging Face processor a dummy text naming every multimodal item of a
prompt, also the items that bypass that processor: precomputed audio features (how this
pipeline sends audio) are passed through as they are. A prompt with audio features and an
image then fails inside the processor (one `<|audio_pad|>` in the text, no audio to expand
it from). The fix names only the items the processor runs on; the model is vLLM's. Qwen2.5-Omni's
processor, which Qwen3-Omni's extends, takes the same fix (qwen2_5_omni/vllm_backend/thinker_model.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm.model_executor.models.qwen3_omni_moe_thinker import (
    Qwen3OmniMoeThinkerDummyInputsBuilder,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    Qwen3OmniMoeThinkerMultiModalProcessor,
    Qwen3OmniMoeThinkerProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.parse import MultiModalDataItems


class ProcessedItemsOnly:
    """The fix, for a Qwen-Omni thinker's multimodal processor class."""

    def _get_hf_mm_inputs(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, object]):
        hf_inputs = super()._get_hf_mm_inputs(mm_items, hf_kwargs)
        if "text" in hf_inputs.hf_data:
            processed = {modality: len(items) for modality, items in mm_items.items() if items.get_processor_data()}
            hf_inputs.hf_data["text"] = self._get_hf_mm_text(processed)
        return hf_inputs


class Qwen3OmniThinkerProcessor(ProcessedItemsOnly, Qwen3OmniMoeThinkerMultiModalProcessor):
    pass


@MULTIMODAL_REGISTRY.register_processor(Qwen3OmniThinkerProcessor, info=Qwen3OmniMoeThinkerProcessingInfo,
                                        dummy_inputs=Qwen3OmniMoeThinkerDummyInputsBuilder)
class Qwen3OmniThinkerForVllm(Qwen3OmniMoeThinkerForConditionalGeneration):
    pass
