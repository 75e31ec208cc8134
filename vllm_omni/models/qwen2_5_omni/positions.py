"""TMRoPE positions of Qwen2.5-Omni's thinker and talker prompts, from transformers' own
`get_rope_index` (see models/qwen3_omni/positions.py for the 4-row layout). An audio token
spans 40 ms, one position at 25 positions per second, so audio and text prompts have plain
positions and a rope delta of 0; only images shift what follows them."""

from __future__ import annotations

import torch
from transformers import Qwen2_5OmniConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniPreTrainedModelForConditionalGeneration as _OmniModel,
)

from vllm_omni.models.qwen3_omni.positions import RopeIndex


def prompt_positions(config: Qwen2_5OmniConfig, input_ids: list[int], audio_lengths: list[int],
                     image_grid_thw: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """[4, 1, P] positions of a thinker prompt, or of the talker's (its text ids: the thinker
    prompt, the voice's text bos, the first answer token), and the rope delta."""
    return RopeIndex(_OmniModel, config.thinker_config).positions(input_ids, audio_lengths, image_grid_thw)
