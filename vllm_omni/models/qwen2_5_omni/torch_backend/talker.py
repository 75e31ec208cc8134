"""Qwen2.5-Omni's talker on the torch backend: one codec id per step (one code is 20 ms: two mel frames).

Its inputs live in the thinker's space; the module projects them (`thinker_to_talker_proj`).
The prompt is the thinker prompt's rows, the voice's text bos plus the codec pad embedding, and
the first answer token's row plus the codec bos embedding, at the TMRoPE positions of their
text ids. Each step then adds the last code's embedding to the next reply row. As in
transformers' `generate`: the repetition penalty counts the codec ids of the prompt's codec
track (mask, pad, bos) and the codes sampled so far, codec bos is never sampled, and codec pad
or codec end ends the speech. Unlike transformers, no other id past the DiT's code embeddings
(`num_embeds`) is sampled either: those are control ids, and token2wav cannot embed them
(transformers' `generate` fails there when a model samples one; a trained talker does not).

transformers 5.19's `generate` drops an all-ones attention mask before the talker's first
forward, and with it the codec pad/bos embeddings and the TMRoPE positions of the talker's
prompt (they are added only when a mask arrives, as for left-padded batch rows); this runner
always adds them, as the model was trained (docs/qwen2_5_omni.md, "Reference").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from vllm_omni.config import SamplingParams
from vllm_omni.engine.backends.torch_sampling import TokenSampler, apply_repetition_penalty
from vllm_omni.models.qwen2_5_omni.checkpoint import Qwen25OmniCheckpoint
from vllm_omni.models.qwen2_5_omni.messages import TalkerJob
from vllm_omni.models.qwen2_5_omni.positions import prompt_positions
from vllm_omni.models.qwen3_omni.positions import step_positions


@dataclass
class TalkerSequence:
    sampling: SamplingParams
    cache: DynamicCache
    sampler: TokenSampler
    history: list[int]  # codec ids the repetition penalty counts
    prompt_length: int = 0
    rope_delta: int = 0
    codes: list[int] = field(default_factory=list)


class TorchTalker:
    def __init__(self, checkpoint: Qwen25OmniCheckpoint):
        self.module = checkpoint.talker
        self.device = self.module.device
        self.config = checkpoint.config
        cfg = checkpoint.config.talker_config
        self.mask_id, self.pad_id = cfg.tts_codec_mask_token_id, cfg.tts_codec_pad_token_id
        self.bos_id, self.end_id = cfg.tts_codec_start_token_id, cfg.tts_codec_end_token_id
        self.stop_ids = (self.pad_id, self.end_id)
        # Only speech codes (the ids token2wav's DiT embeds) and the two stops are sampled
        speech = checkpoint.config.token2wav_config.dit_config.num_embeds
        self._suppressed = torch.tensor([i for i in range(speech, cfg.vocab_size) if i not in self.stop_ids],
                                        device=self.device)
        self.thinker_embeddings = checkpoint.thinker.get_input_embeddings()
        # The reply rows after the answer: a text token's embedding alone (no hidden state)
        self.text_end_row, self.text_pad_row = (self._thinker_embedding(token_id) for token_id in (
            cfg.tts_text_end_token_id, cfg.tts_text_pad_token_id))

    def new_sequence(self, sampling: SamplingParams) -> TalkerSequence:
        return TalkerSequence(sampling=sampling, cache=DynamicCache(config=self.module.config),
                              sampler=TokenSampler(sampling), history=[self.mask_id, self.pad_id, self.bos_id])

    def finished(self, seq: TalkerSequence) -> bool:
        return bool(seq.codes) and (seq.codes[-1] in self.stop_ids or len(seq.codes) >= seq.sampling.max_tokens)

    def stopped(self, seq: TalkerSequence) -> bool:
        return bool(seq.codes) and seq.codes[-1] in self.stop_ids

    def _codec_embedding(self, code: int) -> torch.Tensor:
        return self.module.get_input_embeddings()(torch.tensor([code], device=self.device))[0]

    def _forward(self, seq: TalkerSequence, embeds: torch.Tensor, positions: torch.Tensor) -> int:
        """`embeds` [1, n, H] (thinker space) at `positions` [4, 1, n]."""
        out = self.module(inputs_embeds=embeds.to(self.module.dtype),
                          attention_mask=torch.ones(1, int(positions[0, 0, -1]) + 1, dtype=torch.long,
                                                    device=self.device),
                          position_ids=positions.to(self.device), past_key_values=seq.cache, use_cache=True)
        logits = apply_repetition_penalty(out.logits[0, -1].float(), seq.history, seq.sampling.repetition_penalty)
        logits[self._suppressed] = float("-inf")
        if seq.sampling.ignore_eos or len(seq.codes) < seq.sampling.min_tokens:
            logits[list(self.stop_ids)] = float("-inf")
        code = seq.sampler.choose(logits)
        seq.codes.append(code)
        seq.history.append(code)
        return code

    @torch.no_grad()
    def prefill(self, seq: TalkerSequence, job: TalkerJob) -> int:
        prompt = job.prompt
        rows = torch.cat([job.prompt_rows,
                          (self._thinker_embedding(job.voice.text_bos_id) + self._codec_embedding(self.pad_id))[None],
                          (job.first_row + self._codec_embedding(self.bos_id))[None]])
        text_ids = [*prompt.input_ids, job.voice.text_bos_id, job.first_token]
        positions, seq.rope_delta = prompt_positions(self.config, text_ids, prompt.audio_lengths,
                                                     prompt.image_grid_thw)
        seq.prompt_length = len(text_ids)
        return self._forward(seq, rows[None], positions)

    @torch.no_grad()
    def decode(self, seq: TalkerSequence, reply_row: torch.Tensor) -> int:
        """One step on the last code and the next reply row [H]; returns the next code."""
        past = seq.prompt_length + len(seq.codes) - 1
        embeds = (self._codec_embedding(seq.codes[-1]) + reply_row)[None, None]
        return self._forward(seq, embeds, step_positions(past, 1, seq.rope_delta))

    @torch.no_grad()
    def _thinker_embedding(self, token_id: int) -> torch.Tensor:
        weight = self.thinker_embeddings.weight
        return self.thinker_embeddings(torch.tensor([token_id], device=weight.device))[0].to(self.device)
