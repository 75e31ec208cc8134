"""Tokenizer, chat template and processor files for the tiny Qwen2.5-Omni checkpoint.

The same construction as the tiny Qwen3-Omni tokenizer (qwen3_omni/tiny/tokenizer.py): a
byte-level BPE whose byte, role-word and special-token ids are the real ones, filled up to
the thinker's embedding size, and the same chat template (tool layout included) with
Qwen2.5-Omni's media placeholders. Qwen2.5's vocabulary has no `<tool_response>` special
token, so tool results' tags are plain text there, as in the real tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from transformers import Qwen2_5OmniConfig, Qwen2_5OmniProcessor, Qwen2Tokenizer

from vllm_omni.models.qwen3_omni.tiny.tokenizer import chat_template, qwen_tokenizer, save_omni_processor

# The real checkpoint's special tokens, in id order from 151643 (FIRST_SPECIAL_ID).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_bos|>", "<|vision_eos|>",
    "<|vision_pad|>", "<|IMAGE|>", "<|VIDEO|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
# Qwen2_5OmniProcessor reads these tokenizer attributes.
MEDIA_TOKENS = {"audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>",
                "image_token": "<|IMAGE|>", "video_token": "<|VIDEO|>", "vision_bos_token": "<|vision_bos|>",
                "vision_eos_token": "<|vision_eos|>"}

CHAT_TEMPLATE = chat_template("<|audio_bos|><|AUDIO|><|audio_eos|>", "<|vision_bos|><|IMAGE|><|vision_eos|>",
                              "<|vision_bos|><|VIDEO|><|vision_eos|>")


def build_tokenizer(vocab_size: int) -> Qwen2Tokenizer:
    return qwen_tokenizer(vocab_size, SPECIAL_TOKENS, MEDIA_TOKENS, CHAT_TEMPLATE)


def save_processor(config: Qwen2_5OmniConfig, out_dir: Path) -> None:
    """Write tokenizer, chat template and feature-extractor/image/video processor configs."""
    tokenizer = build_tokenizer(config.thinker_config.text_config.vocab_size)
    save_omni_processor(Qwen2_5OmniProcessor, config.thinker_config.vision_config, tokenizer, out_dir)
