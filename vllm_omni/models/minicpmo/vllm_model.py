"""MiniCPM-o 4.5's duplex thinker as a vLLM model (docs/minicpmo.md, "Stage 0 on vLLM").

The model is vLLM's own MiniCPM-o 4.5 (its Qwen3 LLM; the checkpoint's towers load but stay
idle); only its multimodal processing is ours. The duplex loop computes every embedding row
itself (the streaming audio encoder, the frame encoder, the voice prompt) and sends them as
multimodal embeddings (`enable_mm_embeds`), the only rows vLLM 0.32 accepts in a
streaming-input (resumable) request. A prompt marks each run of rows with one marker token,
`<|audio|>` for audio rows, `<|image_pad|>` for a frame's rows; the processor expands the
marker into one `<unk>` per row (vLLM's id for embedding positions), so no processor of the
checkpoint (remote code) is ever built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from transformers import BatchFeature
from vllm.config.multimodal import MultiModalDummyOptions
from vllm.inputs import MultiModalDataDict
from vllm.model_executor.models.minicpmo import MiniCPMO4_5
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from vllm.multimodal.parse import EmbeddingItems, MultiModalDataItems
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
    PromptUpdate,
)

from vllm_omni.models.minicpmo.tokenizer import UNK_ID

MARKERS = {"audio": "<|audio|>", "image": "<|image_pad|>"}  # one per run of embedding rows in a prompt
MAX_AUDIO_ROWS = 1024  # the longest run of audio rows (a voice prompt: 10 rows per second)


class DuplexProcessingInfo(BaseProcessingInfo):
    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"audio": None, "image": None}

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]) -> Mapping[str, int]:
        return {"audio": MAX_AUDIO_ROWS, "image": self.get_hf_config().query_num}


class DuplexDummyInputsBuilder(BaseDummyInputsBuilder[DuplexProcessingInfo]):
    """Zero rows of the largest sizes, for vLLM's start-up profiling."""

    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return "".join(MARKERS[modality] * mm_counts.get(modality, 0) for modality in MARKERS)

    def get_dummy_mm_data(self, seq_len: int, mm_counts: Mapping[str, int],
                          mm_options: MultiModalDummyOptions) -> MultiModalDataDict:
        hidden = self.info.get_hf_config().hidden_size
        sizes = self.info.get_mm_max_tokens_per_item(seq_len, mm_counts)
        return {modality: [torch.zeros(sizes[modality], hidden) for _ in range(mm_counts.get(modality, 0))]
                for modality in MARKERS if mm_counts.get(modality, 0)}


class DuplexMultiModalProcessor(BaseMultiModalProcessor[DuplexProcessingInfo]):
    def _get_mm_fields_config(self, hf_inputs: BatchFeature,
                              hf_processor_mm_kwargs: Mapping[str, object]) -> Mapping[str, MultiModalFieldConfig]:
        return {f"{modality}_embeds": MultiModalFieldConfig.batched(modality) for modality in MARKERS}

    def _get_prompt_updates(self, mm_items: MultiModalDataItems, hf_processor_mm_kwargs: Mapping[str, object],
                            out_mm_kwargs: MultiModalKwargsItems) -> Sequence[PromptUpdate]:
        tokenizer = self.info.get_tokenizer()

        def rows(modality: str):
            return lambda index: [UNK_ID] * mm_items.get_items(modality, EmbeddingItems).get_feature_size(index)

        return [PromptReplacement(modality=modality, target=[tokenizer.convert_tokens_to_ids(marker)],
                                  replacement=rows(modality)) for modality, marker in MARKERS.items()]


@MULTIMODAL_REGISTRY.register_processor(DuplexMultiModalProcessor, info=DuplexProcessingInfo,
                                        dummy_inputs=DuplexDummyInputsBuilder)
class MiniCPMODuplexThinkerForVllm(MiniCPMO4_5):
    def embed_multimodal(self, **kwargs: object) -> list[torch.Tensor]:
        """The rows as sent: one [rows, hidden] tensor per item (vLLM stacks same-sized items)."""
        dtype = self.llm.model.embed_tokens.weight.dtype
        return [run.to(dtype) for key in ("image_embeds", "audio_embeds") if (runs := kwargs.get(key)) is not None
                for run in runs]
