"""Tokenizer, chat template and processor files for the tiny Qwen3-Omni checkpoint.

Built locally, with no download: a byte-level BPE (models/byte_level_tokenizer.py) whose ids
agree with the real Qwen tokenizer where the pipeline depends on them (each byte's id, the
role words `system`, `user`, `assistant`, every special token), filled up to the thinker's
embedding size.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from transformers import (
    PreTrainedConfig,
    ProcessorMixin,
    Qwen2Tokenizer,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeProcessor,
    WhisperFeatureExtractor,
)

from vllm_omni.models.byte_level_tokenizer import byte_level_tokenizer

FIRST_SPECIAL_ID = 151643
# The real checkpoint's special tokens, in id order from FIRST_SPECIAL_ID.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)

# Qwen's chat-ML layout: one `<|im_start|>role\n ... <|im_end|>\n` block per message; media
# parts become their placeholder (the processor expands the pad token to the feature count).
# Tools follow Qwen3's layout: their JSON signatures in the system turn, calls as
# `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` in the assistant turn, and
# results as `<tool_response>` blocks in a user turn.
def chat_template(audio: str, image: str, video: str) -> str:
    """The chat template, with `audio`, `image` and `video` as the media parts' placeholders
    (plain text without quotes, e.g. `<|audio_start|><|audio_pad|><|audio_end|>`)."""
    content = (
        "{%- if message['content'] is string -%}{{- message['content'] -}}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'audio' -%}{{- '" + audio + "' -}}"
        "{%- elif part['type'] == 'image' -%}{{- '" + image + "' -}}"
        "{%- elif part['type'] == 'video' -%}{{- '" + video + "' -}}"
        "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}"
    )
    return (
        "{%- if tools -%}"
        "{{- '<|im_start|>system\\n' -}}"
        "{%- if messages[0]['role'] == 'system' -%}{%- set message = messages[0] -%}" + content +
        "{{- '\\n\\n' -}}{%- endif -%}"
        "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
        "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
        "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
        "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
        "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
        "{%- endif -%}"
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'tool' -%}"
        "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
        "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}"
        "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
        "{%- elif not (tools and loop.first and message['role'] == 'system') -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' -}}" + content +
        "{%- for call in message.get('tool_calls') or [] -%}"
        "{%- if (loop.first and message['content']) or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
        "{{- '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' -}}"
        "{%- if call['function']['arguments'] is string -%}{{- call['function']['arguments'] -}}"
        "{%- else -%}{{- call['function']['arguments'] | tojson -}}{%- endif -%}"
        "{{- '}\\n</tool_call>' -}}"
        "{%- endfor -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )


CHAT_TEMPLATE = chat_template("<|audio_start|><|audio_pad|><|audio_end|>",
                              "<|vision_start|><|image_pad|><|vision_end|>",
                              "<|vision_start|><|video_pad|><|vision_end|>")


def qwen_tokenizer(vocab_size: int, special_tokens: tuple[str, ...], media_tokens: Mapping[str, str],
                   template: str) -> Qwen2Tokenizer:
    """A Qwen-Omni tokenizer: `special_tokens` in id order from FIRST_SPECIAL_ID, `media_tokens`
    (the processor's attribute → token, e.g. "audio_token": "<|audio_pad|>") and `template`."""
    return byte_level_tokenizer(Qwen2Tokenizer, vocab_size, dict(enumerate(special_tokens, start=FIRST_SPECIAL_ID)),
                                template, unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                extra_special_tokens=dict(media_tokens), model_max_length=32768)


def build_tokenizer(vocab_size: int) -> Qwen2Tokenizer:
    media_tokens = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                    "audio_eos_token": "<|audio_end|>", "image_token": "<|image_pad|>",
                    "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
                    "vision_eos_token": "<|vision_end|>"}
    return qwen_tokenizer(vocab_size, SPECIAL_TOKENS, media_tokens, CHAT_TEMPLATE)


def save_omni_processor(processor_class: type[ProcessorMixin], vision: PreTrainedConfig,
                        tokenizer: Qwen2Tokenizer, out_dir: Path) -> None:
    """Write `tokenizer`, its chat template and the real Qwen-Omni checkpoints' feature-extractor,
    image and video processor configs (patching per the `vision` tower's config) as a
    `processor_class` processor."""
    # The real checkpoints' Whisper settings: 128 mel bins, 10 ms hop, 25 ms window, no dither.
    feature_extractor = WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400, chunk_length=300,
        padding_value=0.0, dither=0.0, return_attention_mask=True)
    image_processor = Qwen2VLImageProcessor(
        patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size, min_pixels=56 * 56, max_pixels=14 * 14 * 4 * 16384)
    video_processor = Qwen2VLVideoProcessor(
        patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size)
    processor = processor_class(
        image_processor=image_processor, video_processor=video_processor,
        feature_extractor=feature_extractor, tokenizer=tokenizer, chat_template=tokenizer.chat_template)
    processor.save_pretrained(str(out_dir))


def save_processor(config: Qwen3OmniMoeConfig, out_dir: Path) -> None:
    """Write tokenizer, chat template and feature-extractor/image/video processor configs."""
    tokenizer = build_tokenizer(config.thinker_config.text_config.vocab_size)
    save_omni_processor(Qwen3OmniMoeProcessor, config.thinker_config.vision_config, tokenizer, out_dir)
