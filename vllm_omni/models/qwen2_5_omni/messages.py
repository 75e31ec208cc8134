"""The messages Qwen2.5-Omni's stages exchange, routed by `family.py`.

The talker reads the thinker's answer as rows in the thinker's space: each fed answer token's
last-layer hidden state plus its embedding (`ReplyRow`), one per talker step. Its prompt is the
thinker prompt's rows, the voice's text bos and the first answer token's row (`TalkerJob`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_omni.config import SamplingParams
from vllm_omni.models.qwen2_5_omni.checkpoint import Voice
from vllm_omni.models.qwen3_omni.prompt import ThinkerPrompt

SAMPLE_RATE = 24000  # BigVGAN's output rate: 240 samples per mel frame, 2 mel frames per code


@dataclass(frozen=True)
class ThinkerPrompted:
    """The prompt's rows for the talker, sent once the thinker has prefilled."""

    prompt: ThinkerPrompt
    rows: torch.Tensor  # [P, H]: last-layer hidden state + input embedding (media positions' embedding zeroed)
    first_token: int


@dataclass(frozen=True)
class ReplyRow:
    """The row of an answer token the thinker fed (in answer order)."""

    row: torch.Tensor  # [H]


@dataclass(frozen=True)
class TalkerJob:
    prompt: ThinkerPrompt
    prompt_rows: torch.Tensor  # [P, H]
    first_token: int
    first_row: torch.Tensor  # [H] the first answer token's row
    voice: Voice
    sampling: SamplingParams


@dataclass(frozen=True)
class Token2WavJob:
    """Opens a request in token2wav: its voice and the seed of its DiT noise."""

    voice: Voice
    seed: int
    one_shot: bool  # all codes arrive at once (async_chunk off): solve the whole answer as one window
