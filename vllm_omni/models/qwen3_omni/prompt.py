"""Render a conversation into thinker token ids with audio placeholders expanded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from vllm_omni.models.qwen3_omni.tool_calls import CALL_OPEN


@dataclass
class ThinkerPrompt:
    input_ids: list[int]
    audio_features: list[torch.Tensor]  # one [128, frames] tensor per audio placeholder, in order

    def __len__(self) -> int:
        return len(self.input_ids)


def audio_token_count(num_frames: int, n_window: int) -> int:
    """Audio-encoder outputs (one `<|audio_pad|>` each) for `num_frames` mel frames."""
    return int(_get_feat_extract_output_lengths(torch.tensor(num_frames), n_window))


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    config: Qwen3OmniMoeConfig,
    messages: Sequence[dict[str, Any]],
    audio_features: Sequence[torch.Tensor],
    tools: Sequence[dict[str, Any]] = (),
    call_tool: bool = False,
) -> ThinkerPrompt:
    """`messages` use the chat-template shape ({'role', 'content'}; content parts of type
    'audio' or 'text'); `audio_features[i]` belongs to the i-th audio part. `tools` go to the
    checkpoint's template as OpenAI-style function tools; `call_tool` opens a tool call after
    the generation prompt, so the answer is the call's JSON."""
    template_tools = [{"type": "function", "function": tool} for tool in tools] or None
    text = tokenizer.apply_chat_template(list(messages), tools=template_tools, add_generation_prompt=True,
                                         tokenize=False)
    if call_tool:
        text += f"{CALL_OPEN}\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    audio_pad = config.thinker_config.audio_token_id
    n_window = config.thinker_config.audio_config.n_window
    if ids.count(audio_pad) != len(audio_features):
        raise ValueError(f"prompt has {ids.count(audio_pad)} audio placeholders but "
                         f"{len(audio_features)} audio inputs")
    expanded: list[int] = []
    features = iter(audio_features)
    for token in ids:
        if token == audio_pad:
            expanded += [audio_pad] * audio_token_count(next(features).shape[-1], n_window)
        else:
            expanded.append(token)
    return ThinkerPrompt(input_ids=expanded, audio_features=list(audio_features))
