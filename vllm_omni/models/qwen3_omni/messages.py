"""The messages Qwen3-Omni's stages exchange (on either backend), routed by `family.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_omni.config import SamplingParams
from vllm_omni.engine.stage_api import StageOutput
from vllm_omni.models.qwen3_omni.prompt import ThinkerPrompt

SAMPLE_RATE = 24000  # code2wav's output rate


@dataclass
class ThinkerPrefill:
    first_token: int
    embeddings: torch.Tensor  # [P, H] layer-0 hidden states (inputs after the multimodal merge)
    accept_hidden: torch.Tensor  # [P, H] input of layer `accept_hidden_layer`


@dataclass(frozen=True)
class ThinkerJob:
    prompt: ThinkerPrompt
    sampling: SamplingParams
    report_prefill: bool  # the talker needs the prompt's hidden rows
    json_schema: dict[str, Any] | None = None  # the answer must be JSON of this schema (a forced tool call)


@dataclass(frozen=True)
class ThinkerPrefilled:
    """What the talker's prompt is built from (sent once the first token exists)."""

    prompt: ThinkerPrompt
    prefill: ThinkerPrefill


@dataclass(frozen=True)
class TalkerJob:
    prompt: ThinkerPrompt  # the thinker's: its ids and media lay out the talker's prompt (talker_bridge.py)
    prefill: ThinkerPrefill
    speaker: str
    sampling: SamplingParams


@dataclass(frozen=True)
class TrailingText:
    """Generated text tokens the thinker fed back, in order (one talker step each)."""

    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class ThinkerFinished:
    pass


@dataclass(frozen=True)
class CodecFrame(StageOutput):
    codes: tuple[int, ...]  # 16 codebook ids of one 80 ms frame


@dataclass(frozen=True)
class CodecChunk:
    frames: torch.Tensor  # [16, n]
    final: bool
