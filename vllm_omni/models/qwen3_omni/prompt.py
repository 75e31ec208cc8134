"""Render a conversation into thinker token ids with audio and image placeholders expanded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from vllm_omni.models.qwen3_omni.images import ThinkerImage
from vllm_omni.models.qwen3_omni.tool_calls import CALL_OPEN


@dataclass
class ThinkerPrompt:
    input_ids: list[int]
    audio_features: list[torch.Tensor]  # one [128, frames] tensor per audio placeholder, in order
    images: list[ThinkerImage] = field(default_factory=list)  # one per image placeholder, in order
    audio_tokens: int = 0  # positions holding audio embeddings (of the prompt's length)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def image_tokens(self) -> int:
        return sum(image.num_tokens for image in self.images)

    @property
    def audio_lengths(self) -> list[int]:
        """Mel frames of each audio item."""
        return [f.shape[-1] for f in self.audio_features]

    @property
    def image_grid_thw(self) -> torch.Tensor | None:
        """[images, 3] patch grids, as transformers' thinker takes them; None without images."""
        return torch.stack([image.grid_thw for image in self.images]) if self.images else None


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
    images: Sequence[ThinkerImage] = (),
) -> ThinkerPrompt:
    """`messages` use the chat-template shape ({'role', 'content'}; content parts of type
    'image', 'audio' or 'text'); `audio_features[i]` belongs to the i-th audio part, `images[i]`
    to the i-th image part. `tools` go to the checkpoint's template as OpenAI-style function
    tools; `call_tool` opens a tool call after the generation prompt, so the answer is the
    call's JSON."""
    template_tools = [{"type": "function", "function": tool} for tool in tools] or None
    text = tokenizer.apply_chat_template(list(messages), tools=template_tools, add_generation_prompt=True,
                                         tokenize=False)
    if call_tool:
        text += f"{CALL_OPEN}\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    thinker = config.thinker_config
    audio_pad, image_pad = thinker.audio_token_id, thinker.image_token_id
    for name, pad, inputs in (("audio", audio_pad, audio_features), ("image", image_pad, images)):
        if ids.count(pad) != len(inputs):
            raise ValueError(f"prompt has {ids.count(pad)} {name} placeholders but {len(inputs)} {name} inputs")
    # Each placeholder becomes as many pads as the encoder has outputs for its item (as the
    # checkpoint's processor expands them).
    audio_sizes = [audio_token_count(f.shape[-1], thinker.audio_config.n_window) for f in audio_features]
    sizes = {audio_pad: iter(audio_sizes),
             image_pad: iter([image.num_tokens for image in images])}
    expanded: list[int] = []
    for token in ids:
        expanded += [token] * next(sizes[token]) if token in sizes else [token]
    return ThinkerPrompt(input_ids=expanded, audio_features=list(audio_features), images=list(images),
                         audio_tokens=sum(audio_sizes))
