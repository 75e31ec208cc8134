"""Render a conversation into Qwen2.5-Omni thinker ids, audio and image placeholders expanded
(the chat template and tool layout are Qwen3-Omni's: models/qwen3_omni/prompt.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, Qwen2_5OmniConfig

from vllm_omni.models.qwen3_omni.images import ThinkerImage
from vllm_omni.models.qwen3_omni.prompt import ThinkerPrompt, expand_placeholders, template_ids


def audio_token_count(num_frames: int) -> int:
    """Audio-encoder outputs for `num_frames` mel frames: two stride-2 stages (its conv, its pooling)."""
    return ((num_frames - 1) // 2 + 1 - 2) // 2 + 1


def render_prompt(tokenizer: PreTrainedTokenizerBase, config: Qwen2_5OmniConfig, im_end_id: int,
                  messages: Sequence[dict[str, Any]], audio_features: Sequence[torch.Tensor],
                  tools: Sequence[dict[str, Any]] = (), call_tool: bool = False,
                  images: Sequence[ThinkerImage] = ()) -> ThinkerPrompt:
    ids = template_ids(tokenizer, messages, tools, call_tool, im_end_id)
    thinker = config.thinker_config
    return expand_placeholders(ids, thinker.audio_token_index, thinker.image_token_index, audio_features,
                               [audio_token_count(f.shape[-1]) for f in audio_features], images)
