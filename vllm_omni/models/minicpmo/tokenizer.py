"""MiniCPM-o 4.5's tokenizer class and special tokens (docs/minicpmo.md).

The checkpoint's tokenizer is Qwen's byte-level BPE plus special tokens for images, slices,
audio, speakers and the duplex loop. Its own class ships as remote code; this one exposes
the same named markers and ids (vLLM's MiniCPM-o processor reads them) and the
`bad_token_ids` of `tokenizer_config.json` (ids duplex decoding never samples).
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen2Tokenizer

# The real tokenizer's special tokens (its added_tokens.json), by id; `<unk>` (128244) is a
# vocabulary entry that vLLM uses as the placeholder id of image and audio rows.
UNK = "<unk>"
UNK_ID = 128244
FIRST_SPECIAL_ID = 151643
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<image>", "</image>", "<ref>", "</ref>", "<box>", "</box>", "<quad>", "</quad>",
    "<point>", "</point>", "<slice>", "</slice>", "<image_id>", "</image_id>", "<unit>", "</unit>", "<answer>",
    "</answer>", "<focus>", "</focus>", "<line>", "</line>", "<perception>", "</perception>", "<source_image>",
    "</source_image>", "<image_save_to>", "</image_save_to>", "<|audio_start|>", "<|audio|>", "<|audio_end|>",
    "<|spk_bos|>", "<|spk|>", "<|spk_eos|>", "<|tts_bos|>", "<|tts_eos|>", "<|listen|>", "<|speak|>",
    "<|interrupt|>", "<|vad_start|>", "<|vad_end|>", "<|emotion_start|>", "<|emotion_end|>", "<|speed_start|>",
    "<|speed_end|>", "<|pitch_start|>", "<|pitch_end|>", "<|turn_bos|>", "<|turn_eos|>", "<|chunk_eos|>",
    "<|chunk_bos|>", "<|chunk_tts_bos|>", "<|chunk_tts_eos|>", "<|tts_pad|>",
    *(f"<|timbre_{n}|>" for n in range(7, 32)),
)
SPECIAL_TOKEN_IDS = {**dict(enumerate(SPECIAL_TOKENS, start=FIRST_SPECIAL_ID)), UNK_ID: UNK}


class MiniCPMOTokenizer(Qwen2Tokenizer):
    """Qwen's tokenizer with MiniCPM-o's named markers. Each `X` string below has an `X_id`."""

    im_start = "<image>"
    im_end = "</image>"
    slice_start = "<slice>"
    slice_end = "</slice>"
    im_id_start = "<image_id>"
    im_id_end = "</image_id>"
    audio_start = "<|audio_start|>"
    audio_end = "<|audio_end|>"
    spk_start = "<|spk_bos|>"
    spk_end = "<|spk_eos|>"
    tts_start = "<|tts_bos|>"
    tts_end = "<|tts_eos|>"
    MARKERS = ("im_start", "im_end", "slice_start", "slice_end", "im_id_start", "im_id_end", "audio_start",
               "audio_end", "spk_start", "spk_end", "tts_start", "tts_end")

    def __getattr__(self, name: str) -> Any:
        marker = name.removesuffix("_id")
        if name.endswith("_id") and marker in self.MARKERS:
            return self.convert_tokens_to_ids(getattr(self, marker))
        return super().__getattr__(name)

    @property
    def bos_id(self) -> int:
        return self.bos_token_id

    @property
    def eos_id(self) -> int:
        return self.eos_token_id

    @property
    def unk_id(self) -> int:
        return self.convert_tokens_to_ids(UNK)

    @property
    def bad_token_ids(self) -> list[int]:
        """Ids duplex decoding masks (the checkpoint's `tokenizer_config.json` lists them)."""
        return list(self.init_kwargs.get("bad_token_ids") or [])


def register_tokenizer() -> None:
    """Let `tokenizer_class: MiniCPMOTokenizer` in a checkpoint's tokenizer config resolve."""
    from transformers import AutoTokenizer

    from vllm_omni.models.minicpmo.config import MiniCPMOConfig

    AutoTokenizer.register(MiniCPMOConfig, tokenizer_class=MiniCPMOTokenizer, exist_ok=True)
