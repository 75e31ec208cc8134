"""M-RoPE positions of the thinker's and the talker's prompts, from transformers' own `get_rope_index`.

transformers' `generate` gives Qwen3-Omni's thinker and talker 4-row position ids: a text row
(0, 1, 2, ...) and the temporal/height/width rows of `get_rope_index`. Those equal the text
row unless the prompt holds images: an image's positions follow its patch grid, so it spans
fewer positions than tokens, and everything after it is shifted by the prompt's rope delta
(negative). Each later input continues the text row and adds the delta to the t/h/w rows.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoePreTrainedModelForConditionalGeneration as _OmniModel,
)


class RopeIndex:
    """What transformers' `get_rope_index` of `model_class` reads of the model it is a method
    of, without the model (with vLLM engines holding the weights, this process has none)."""

    def __init__(self, model_class: type, config: Any):
        self.config = config
        self.spatial_merge_size = config.vision_config.spatial_merge_size
        self._model_class = model_class

    def __getattr__(self, name: str) -> Any:  # get_rope_index and the helpers it calls
        return types.MethodType(getattr(self._model_class, name), self)

    def positions(self, input_ids: list[int], audio_lengths: list[int],
                  image_grid_thw: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        """[4, 1, P] positions of a prompt (a text row, then the t/h/w rows), and its rope delta.
        `audio_lengths` are the mel frames of its audio items, `image_grid_thw` its images' patch grids."""
        ids = torch.tensor([input_ids])
        lengths = torch.tensor(audio_lengths) if audio_lengths else None
        rows, delta = self.get_rope_index(ids, image_grid_thw, None, torch.ones_like(ids), False, lengths)
        text = torch.arange(len(input_ids)).view(1, 1, -1)
        return torch.cat((text, rows.long())), int(delta.flatten()[0])


def prompt_positions(config: Qwen3OmniMoeConfig, input_ids: list[int], audio_lengths: list[int],
                     image_grid_thw: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """[4, 1, P] positions of a thinker or talker prompt, and its rope delta (`RopeIndex.positions`).

    The talker's own `get_rope_index` is this method on the talker config, whose token ids,
    spatial merge and position_id_per_seconds are the thinker's; it lacks the audio encoder's
    `n_window`, which the method reads for the audio of a prompt with images (transformers'
    talker fails on such prompts), so the thinker config serves both.
    """
    return RopeIndex(_OmniModel, config.thinker_config).positions(input_ids, audio_lengths, image_grid_thw)


def step_positions(past: int, length: int, delta: int = 0) -> torch.Tensor:
    """[4, 1, length] positions of `length` inputs after `past` earlier ones."""
    text = torch.arange(past, past + length).view(1, 1, -1)
    return torch.cat((text, (text + delta).expand(3, -1, -1)))
