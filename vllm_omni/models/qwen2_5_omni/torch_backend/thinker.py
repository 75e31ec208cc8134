"""Qwen2.5-Omni's thinker on the torch backend: Qwen3-Omni's runner (one KV cache per request,
transformers' inputs exactly) with the rows the talker reads (messages.py): the prompt's at
prefill, and each fed answer token's at its decode step."""

from __future__ import annotations

import torch

from vllm_omni.models.qwen2_5_omni.checkpoint import Qwen25OmniCheckpoint
from vllm_omni.models.qwen2_5_omni.positions import prompt_positions
from vllm_omni.models.qwen3_omni.positions import step_positions
from vllm_omni.models.qwen3_omni.torch_backend.thinker import ThinkerSequence
from vllm_omni.models.qwen3_omni.torch_backend.thinker import TorchThinker as _Qwen3Thinker


class TorchThinker(_Qwen3Thinker):
    def __init__(self, checkpoint: Qwen25OmniCheckpoint):  # not super().__init__: it reads Qwen3-Omni's config
        self.module = checkpoint.thinker
        self.device = self.module.device
        self.config = checkpoint.config
        self.eos_token_id = checkpoint.im_end_id
        thinker = checkpoint.config.thinker_config
        self._media_ids = (thinker.audio_token_index, thinker.image_token_index, thinker.video_token_index)

    @torch.no_grad()
    def prefill(self, seq: ThinkerSequence) -> tuple[int, torch.Tensor]:
        """The first answer token and the prompt's talker rows [P, H]."""
        prompt = seq.prompt
        positions, seq.rope_delta = prompt_positions(self.config, prompt.input_ids, prompt.audio_lengths,
                                                     prompt.image_grid_thw)
        ids = torch.tensor([prompt.input_ids], device=self.device)
        out = self.module(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions.to(self.device),
                          past_key_values=seq.cache, use_cache=True, output_hidden_states=True,
                          **self._media_inputs(prompt))
        embeddings = out.hidden_states[0][0].clone()
        embeddings[torch.isin(ids[0], torch.tensor(self._media_ids, device=self.device))] = 0
        return self._choose(seq, out.logits[0, -1]), out.hidden_states[-1][0] + embeddings

    @torch.no_grad()
    def decode(self, seq: ThinkerSequence) -> tuple[int, torch.Tensor]:
        """Feed the last generated token: the next one, and the fed token's talker row [H]."""
        past = len(seq.prompt.input_ids) + len(seq.generated) - 1
        out = self.module(input_ids=torch.tensor([[seq.generated[-1]]], device=self.device),
                          attention_mask=torch.ones(1, past + 1, dtype=torch.long, device=self.device),
                          position_ids=step_positions(past, 1, seq.rope_delta).to(self.device),
                          past_key_values=seq.cache, use_cache=True, output_hidden_states=True)
        row = out.hidden_states[-1][0, -1] + out.hidden_states[0][0, -1]
        return self._choose(seq, out.logits[0, -1]), row
