"""Tokenizer, chat template and processor files for the tiny Qwen3-Omni checkpoint.

Built locally, with no download: a byte-level BPE whose ids agree with the real Qwen
tokenizer where the pipeline depends on them (each byte's id, the role words `system`,
`user`, `assistant`, every special token), padded with unreachable filler tokens (" t<id>") to
the thinker's embedding size so that every id a random model emits still decodes.
"""

from __future__ import annotations

from pathlib import Path

from transformers import (
    Qwen2Tokenizer,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeProcessor,
    WhisperFeatureExtractor,
)

from vllm_omni.models.qwen3_omni.tiny.config import ASSISTANT_WORD, SYSTEM_WORD, USER_WORD

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
ROLE_WORD_IDS = {"system": SYSTEM_WORD, "user": USER_WORD, "assistant": ASSISTANT_WORD}

# Qwen's chat-ML layout: one `<|im_start|>role\n ... <|im_end|>\n` block per message; media
# parts become their placeholder (the processor expands the pad token to the feature count).
# Tools follow Qwen3's layout: their JSON signatures in the system turn, calls as
# `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` in the assistant turn, and
# results as `<tool_response>` blocks in a user turn.
_CONTENT = (
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
)
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{%- set message = messages[0] -%}" + _CONTENT +
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
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}" + _CONTENT +
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


def byte_level_alphabet() -> list[str]:
    """GPT-2 / Qwen byte-to-unicode alphabet, in token-id order ('\\n' is id 198, ' ' is 220)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    remapped = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(remapped))]


def _role_word_merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Merges that spell each role word left to right; intermediate pieces get free ids."""
    reserved = set(ROLE_WORD_IDS.values())
    next_free = len(vocab)
    merges: list[tuple[str, str]] = []
    for word, word_id in ROLE_WORD_IDS.items():
        piece = word[0]
        for char in word[1:]:
            merges.append((piece, char))
            piece += char
            if piece in vocab:
                continue
            if piece == word:
                vocab[piece] = word_id
            else:
                while next_free in reserved:
                    next_free += 1
                vocab[piece] = next_free
                next_free += 1
    return merges


def build_tokenizer(vocab_size: int) -> Qwen2Tokenizer:
    vocab = {char: i for i, char in enumerate(byte_level_alphabet())}
    merges = _role_word_merges(vocab)
    used = set(vocab.values())
    for token_id in range(vocab_size):
        if FIRST_SPECIAL_ID <= token_id < FIRST_SPECIAL_ID + len(SPECIAL_TOKENS):
            vocab[SPECIAL_TOKENS[token_id - FIRST_SPECIAL_ID]] = token_id
        elif token_id not in used:
            # Unreachable by encoding (no merges lead there); decodes as " t<id>" so a random
            # model's answers read as words in transcripts.
            vocab[f"\u0120t{token_id}"] = token_id
    media_tokens = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                    "audio_eos_token": "<|audio_end|>", "image_token": "<|image_pad|>",
                    "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
                    "vision_eos_token": "<|vision_end|>"}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>",
                               pad_token="<|endoftext|>", extra_special_tokens=media_tokens,
                               model_max_length=32768)
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)},
                                 replace_extra_special_tokens=False)
    if len(tokenizer) != vocab_size:
        raise RuntimeError(f"tiny tokenizer has {len(tokenizer)} tokens, expected {vocab_size}")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_processor(config: Qwen3OmniMoeConfig, out_dir: Path) -> None:
    """Write tokenizer, chat template and feature-extractor/image/video processor configs."""
    vision = config.thinker_config.vision_config
    # The real checkpoint's Whisper settings: 128 mel bins, 10 ms hop, 25 ms window, no dither.
    feature_extractor = WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400, chunk_length=300,
        padding_value=0.0, dither=0.0, return_attention_mask=True)
    image_processor = Qwen2VLImageProcessor(
        patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size, min_pixels=56 * 56, max_pixels=14 * 14 * 4 * 16384)
    video_processor = Qwen2VLVideoProcessor(
        patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size)
    tokenizer = build_tokenizer(config.thinker_config.text_config.vocab_size)
    processor = Qwen3OmniMoeProcessor(
        image_processor=image_processor, video_processor=video_processor,
        feature_extractor=feature_extractor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(str(out_dir))
