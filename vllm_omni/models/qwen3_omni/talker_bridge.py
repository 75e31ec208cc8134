"""Thinker -> talker: the talker's prompt rows and its trailing-text rows.

Layout (qwen3-omni-pipeline.md §4), computed as transformers' `generate` does:
* user segments (every position whose chat-ML block has role `user`): the thinker's
  accept-layer hidden state through `hidden_projection` at audio/image/video positions,
  the layer-0 embedding through `text_projection` elsewhere; system and earlier assistant
  segments are skipped;
* the last assistant segment as 9 rows: `<|im_start|>`, `assistant`, `\\n` (text only),
  tts_pad x4 + codec nothink / think_bos / think_eos / speaker, tts_bos + codec_pad, and
  the first generated token + codec_bos;
* then one trailing row per talker step: each later generated token that the thinker fed
  back (the last generated token is never fed), then tts_eos once, then tts_pad.

The talker can therefore start as soon as the thinker has sampled its first token. Its
prompt's M-RoPE positions are computed as transformers' talker computes them from its
input ids (the user positions' thinker ids, then tts_pad per assistant row): sequential,
unless images lie in the user turns (positions.py).

The rows are made on the talker's device; the thinker's hidden states and embedding rows are
brought there (with torch stages on different devices, or a torch thinker beside a vLLM talker).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import Qwen3OmniMoeConfig

from vllm_omni.models.qwen3_omni.checkpoint import Qwen3OmniCheckpoint
from vllm_omni.models.qwen3_omni.messages import ThinkerPrefill
from vllm_omni.models.qwen3_omni.positions import prompt_positions
from vllm_omni.models.qwen3_omni.prompt import ThinkerPrompt

ASSISTANT_ROWS = 9  # rows of the last assistant segment in the talker's prompt (see above)


@dataclass
class TtsRows:
    bos: torch.Tensor  # [1, 1, D]
    eos: torch.Tensor
    pad: torch.Tensor


def user_positions(input_ids: torch.Tensor, im_start_id: int, user_id: int) -> torch.Tensor:
    """Indices of positions inside user chat-ML blocks (from `<|im_start|>` to the next one)."""
    positions = torch.arange(input_ids.numel(), device=input_ids.device)
    starts = torch.where(input_ids == im_start_id, positions, torch.full_like(positions, -1))
    block_start = torch.cummax(starts, dim=0).values.clamp_min(0)
    roles = input_ids[(block_start + 1).clamp_max(input_ids.numel() - 1)]
    return torch.nonzero(roles == user_id).flatten()


def speaker_codec_id(config: Qwen3OmniMoeConfig, speaker: str) -> int:
    speakers = config.talker_config.speaker_id
    if speaker.lower() not in speakers:
        raise ValueError(f"unknown speaker {speaker!r} (this checkpoint has: {', '.join(sorted(speakers))})")
    return speakers[speaker.lower()]


class ThinkerToTalkerBridge:
    def __init__(self, checkpoint: Qwen3OmniCheckpoint):
        self.config = checkpoint.config
        self.talker = checkpoint.talker
        self.device = next(self.talker.text_projection.parameters()).device
        self.thinker_embeddings = checkpoint.thinker.get_input_embeddings()
        self._tts: TtsRows | None = None

    def _thinker_rows(self, token_ids: list[int]) -> torch.Tensor:
        """The thinker's layer-0 embedding rows of `token_ids`, [n, H], on the talker's device."""
        ids = torch.tensor(token_ids, device=self.thinker_embeddings.weight.device)
        return self.thinker_embeddings(ids).to(self.device)

    @torch.no_grad()
    def tts_rows(self) -> TtsRows:
        if self._tts is None:
            rows = self._thinker_rows([self.config.tts_bos_token_id, self.config.tts_eos_token_id,
                                       self.config.tts_pad_token_id])
            bos, eos, pad = self.talker.text_projection(rows[None]).chunk(3, dim=1)
            self._tts = TtsRows(bos=bos, eos=eos, pad=pad)
        return self._tts

    @torch.no_grad()
    def prompt_embeddings(self, input_ids: list[int], prefill: ThinkerPrefill, speaker: str) -> torch.Tensor:
        """The talker's prompt rows [1, P_talker, D]."""
        config, talker = self.config, self.talker
        ids = torch.tensor(input_ids, device=self.device)
        thinker_cfg = config.thinker_config
        multimodal = (ids == thinker_cfg.audio_token_id) | (ids == thinker_cfg.image_token_id) | \
            (ids == thinker_cfg.video_token_id)
        embeddings = prefill.embeddings.to(self.device)
        projected = torch.empty(len(input_ids), config.talker_config.text_config.hidden_size,
                                dtype=talker.dtype, device=self.device)
        if multimodal.any():
            projected[multimodal] = talker.hidden_projection(prefill.accept_hidden.to(self.device)[multimodal])
        projected[~multimodal] = talker.text_projection(embeddings[~multimodal])
        user_rows = projected[user_positions(ids, config.im_start_token_id, config.user_token_id)]

        starts = torch.nonzero((ids[:-1] == config.im_start_token_id) &
                               (ids[1:] == config.assistant_token_id)).flatten()
        if starts.numel() == 0:
            raise ValueError("thinker prompt has no assistant turn to speak")
        assistant_start = int(starts[-1])
        first_token = self._thinker_rows([prefill.first_token])
        assistant = talker.text_projection(torch.cat((embeddings[assistant_start:], first_token))[None])
        tts = self.tts_rows()
        text_part = torch.cat((assistant[:, :3], tts.pad.expand(1, 4, -1), tts.bos, assistant[:, 3:4]), dim=1)
        talker_cfg = config.talker_config
        codec_ids = torch.tensor([[talker_cfg.codec_nothink_id, talker_cfg.codec_think_bos_id,
                                   talker_cfg.codec_think_eos_id, speaker_codec_id(config, speaker),
                                   talker_cfg.codec_pad_id, talker_cfg.codec_bos_id]], device=self.device)
        codec_part = torch.cat((torch.zeros(1, 3, text_part.shape[-1], dtype=talker.dtype, device=self.device),
                                talker.get_input_embeddings()(codec_ids)), dim=1)
        return torch.cat((user_rows[None], text_part + codec_part), dim=1)

    def prompt_positions(self, prompt: ThinkerPrompt) -> tuple[torch.Tensor, int]:
        """M-RoPE positions [4, 1, P_talker] of the talker's prompt rows and their rope delta."""
        ids = torch.tensor(prompt.input_ids)
        user_ids = ids[user_positions(ids, self.config.im_start_token_id, self.config.user_token_id)].tolist()
        talker_ids = user_ids + [self.config.tts_pad_token_id] * ASSISTANT_ROWS
        return prompt_positions(self.config, talker_ids, prompt.audio_lengths, prompt.image_grid_thw)

    @torch.no_grad()
    def trailing_rows(self, token_ids: list[int]) -> torch.Tensor:
        """Trailing rows [n, 1, D] of generated tokens that the thinker fed back."""
        return self.talker.text_projection(self._thinker_rows(token_ids))[:, None]
