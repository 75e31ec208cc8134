"""Thinker on the torch backend: transformers' own module, one KV cache per request.

Each call runs one request's prefill or one decode step with exactly the inputs that
transformers' `generate` would use (audio features, image patches and their grids, 4-row
M-RoPE position ids from its `get_rope_index` (positions.py), an all-ones attention mask),
so greedy tokens equal the reference. Requests interleave step by step; each keeps its own
cache and rope delta, so concurrent requests do not change each other's results. Inputs are
made on the module's device (the stage's `torch_device`); token choice reads the logits there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from vllm_omni.config import SamplingParams
from vllm_omni.engine.backends.torch_sampling import TokenSampler, apply_repetition_penalty
from vllm_omni.models.qwen3_omni.checkpoint import Qwen3OmniCheckpoint
from vllm_omni.models.qwen3_omni.messages import ThinkerPrefill
from vllm_omni.models.qwen3_omni.positions import prompt_positions, step_positions
from vllm_omni.models.qwen3_omni.prompt import ThinkerPrompt


@dataclass
class ThinkerSequence:
    prompt: ThinkerPrompt
    sampling: SamplingParams
    eos_token_id: int
    cache: DynamicCache
    sampler: TokenSampler
    generated: list[int] = field(default_factory=list)
    rope_delta: int = 0  # of the prompt's M-RoPE positions, added to every later one's t/h/w rows

    @property
    def stopped(self) -> bool:
        """The last token ends the answer: EOS or one of the request's `stop_token_ids` (as on vLLM)."""
        return bool(self.generated) and (self.generated[-1] == self.eos_token_id
                                          or self.generated[-1] in self.sampling.stop_token_ids)

    @property
    def finished(self) -> bool:
        return self.stopped or len(self.generated) >= self.sampling.max_tokens

    @property
    def finish_reason(self) -> str:
        return "stop" if self.stopped else "length"


class TorchThinker:
    def __init__(self, checkpoint: Qwen3OmniCheckpoint):
        self.module = checkpoint.thinker
        self.device = self.module.device
        self.config = checkpoint.config
        self.accept_layer = checkpoint.config.talker_config.accept_hidden_layer
        self.eos_token_id = checkpoint.config.im_end_token_id

    def new_sequence(self, prompt: ThinkerPrompt, sampling: SamplingParams) -> ThinkerSequence:
        return ThinkerSequence(prompt=prompt, sampling=sampling, eos_token_id=self.eos_token_id,
                               cache=DynamicCache(config=self.module.config.get_text_config()),
                               sampler=TokenSampler(sampling))

    def _choose(self, seq: ThinkerSequence, logits: torch.Tensor) -> int:
        logits = apply_repetition_penalty(logits.float(), seq.generated, seq.sampling.repetition_penalty)
        if len(seq.generated) < seq.sampling.min_tokens and not seq.sampling.ignore_eos:
            logits[[seq.eos_token_id, *seq.sampling.stop_token_ids]] = float("-inf")
        token = seq.sampler.choose(logits)
        seq.generated.append(token)
        return token

    def _media_inputs(self, prompt: ThinkerPrompt) -> dict[str, torch.Tensor]:
        """The prompt's audio features (padded, with their mask) and image patches, as the
        checkpoint's processor hands them to transformers' thinker."""
        inputs: dict[str, torch.Tensor] = {}
        if prompt.audio_features:
            frames = prompt.audio_lengths
            features = torch.zeros(len(frames), prompt.audio_features[0].shape[0], max(frames))
            mask = torch.zeros(len(frames), max(frames), dtype=torch.long)
            for i, f in enumerate(prompt.audio_features):
                features[i, :, : f.shape[-1]] = f
                mask[i, : f.shape[-1]] = 1
            inputs = {"input_features": features.to(self.device, self.module.dtype),
                      "feature_attention_mask": mask.to(self.device)}
        if prompt.images:
            inputs["pixel_values"] = torch.cat([image.pixel_values for image in prompt.images]).to(self.device)
            inputs["image_grid_thw"] = prompt.image_grid_thw.to(self.device)
        return inputs

    @torch.no_grad()
    def prefill(self, seq: ThinkerSequence) -> ThinkerPrefill:
        prompt = seq.prompt
        positions, seq.rope_delta = prompt_positions(self.config, prompt.input_ids, prompt.audio_lengths,
                                                     prompt.image_grid_thw)
        out = self.module(input_ids=torch.tensor([prompt.input_ids], device=self.device),
                          attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=self.device),
                          position_ids=positions.to(self.device),
                          past_key_values=seq.cache, use_cache=True, output_hidden_states=True,
                          **self._media_inputs(prompt))
        token = self._choose(seq, out.logits[0, -1])
        return ThinkerPrefill(first_token=token, embeddings=out.hidden_states[0][0],
                              accept_hidden=out.hidden_states[self.accept_layer][0])

    @torch.no_grad()
    def decode(self, seq: ThinkerSequence) -> int:
        """Feed the last generated token; return the next one."""
        past = len(seq.prompt.input_ids) + len(seq.generated) - 1
        out = self.module(input_ids=torch.tensor([[seq.generated[-1]]], device=self.device),
                          attention_mask=torch.ones(1, past + 1, dtype=torch.long, device=self.device),
                          position_ids=step_positions(past, 1, seq.rope_delta).to(self.device),
                          past_key_values=seq.cache,
                          use_cache=True)
        return self._choose(seq, out.logits[0, -1])

    @torch.no_grad()
    def token_embeddings(self, token_ids: list[int]) -> torch.Tensor:
        """Layer-0 rows of generated text tokens: a table lookup, [n, H]."""
        return self.module.get_input_embeddings()(torch.tensor(token_ids, device=self.device))
