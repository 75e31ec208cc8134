"""Talker on the torch backend: codebook 0 from the talker, codebooks 1..15 from the code
predictor, one 80 ms codec frame per step (qwen3-omni-pipeline.md §5).

Mirrors transformers' `generate`: codec ids [vocab - 1024, vocab) other than the codec EOS
are suppressed; repetition penalty applies to the codebook-0 ids generated so far; the
code predictor samples (top-k 50, top-p 0.8) only when the talker samples; a frame is
complete once its residual codes exist, so the token that reaches `max_tokens` is not
synthesised (as in the reference). Inputs are made on the module's device (the stage's
`torch_device`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from vllm_omni.config import SamplingParams
from vllm_omni.engine.backends.torch_sampling import TokenSampler, apply_repetition_penalty
from vllm_omni.models.qwen3_omni.checkpoint import Qwen3OmniCheckpoint
from vllm_omni.models.qwen3_omni.code_predictor import CodePredictor
from vllm_omni.models.qwen3_omni.positions import step_positions

SUPPRESSED_TAIL = 1024  # the last 1024 codec ids are control tokens, never sampled (but EOS)


def code_predictor_sampling(talker: SamplingParams) -> SamplingParams:
    if talker.temperature == 0:
        return SamplingParams(temperature=0.0)
    seed = None if talker.seed is None else talker.seed + 1
    return SamplingParams(temperature=1.0, top_k=50, top_p=0.8, seed=seed)


@dataclass
class TalkerSequence:
    sampling: SamplingParams
    cache: DynamicCache
    sampler: TokenSampler
    residual_sampler: TokenSampler
    prompt_length: int = 0
    rope_delta: int = 0  # of the prompt's M-RoPE positions (talker_bridge.py), added to later t/h/w rows
    codes0: list[int] = field(default_factory=list)  # sampled codebook-0 ids
    last_hidden: torch.Tensor | None = None  # [1, 1, D] talker output at the last position
    steps: int = 0  # decode steps done (= trailing rows consumed)


class TorchTalker:
    def __init__(self, checkpoint: Qwen3OmniCheckpoint):
        self.module = checkpoint.talker
        self.device = self.module.device
        cfg = checkpoint.config.talker_config
        self.eos_token_id = cfg.codec_eos_token_id
        vocab = cfg.text_config.vocab_size
        self._suppressed = torch.tensor([i for i in range(vocab - SUPPRESSED_TAIL, vocab)
                                         if i != self.eos_token_id], device=self.device)
        self.code_predictor = CodePredictor(self.module.code_predictor, cfg.num_code_groups)

    def new_sequence(self, sampling: SamplingParams) -> TalkerSequence:
        return TalkerSequence(sampling=sampling,
                              cache=DynamicCache(config=self.module.config.text_config),
                              sampler=TokenSampler(sampling),
                              residual_sampler=TokenSampler(code_predictor_sampling(sampling)))

    def finished(self, seq: TalkerSequence) -> bool:
        """EOS sampled, or the last allowed token sampled (it gets no frame)."""
        return bool(seq.codes0) and (seq.codes0[-1] == self.eos_token_id
                                     or len(seq.codes0) >= seq.sampling.max_tokens)

    def _forward(self, seq: TalkerSequence, embeds: torch.Tensor, positions: torch.Tensor) -> int:
        """`positions` [4, 1, n] of the `embeds` rows [1, n, D]; their text row ends at the cache's length."""
        out = self.module(inputs_embeds=embeds,
                          attention_mask=torch.ones(1, int(positions[0, 0, -1]) + 1, dtype=torch.long,
                                                    device=self.device),
                          position_ids=positions.to(self.device), past_key_values=seq.cache,
                          use_cache=True, output_hidden_states=True,
                          generation_step=seq.steps)  # only echoed back by transformers
        seq.last_hidden = out.hidden_states[0][-1][:, -1:]
        logits = out.logits[0, -1].float()
        logits = apply_repetition_penalty(logits, seq.codes0, seq.sampling.repetition_penalty)
        logits[self._suppressed] = float("-inf")
        if seq.sampling.ignore_eos or len(seq.codes0) < seq.sampling.min_tokens:
            logits[self.eos_token_id] = float("-inf")
        token = seq.sampler.choose(logits)
        seq.codes0.append(token)
        return token

    @torch.no_grad()
    def prefill(self, seq: TalkerSequence, prompt_embeds: torch.Tensor, positions: torch.Tensor,
                rope_delta: int) -> int:
        """`prompt_embeds` [1, P, D] at `positions` [4, 1, P] (talker_bridge.py)."""
        seq.prompt_length, seq.rope_delta = prompt_embeds.shape[1], rope_delta
        return self._forward(seq, prompt_embeds.to(self.module.dtype), positions)

    @torch.no_grad()
    def complete_frame(self, seq: TalkerSequence) -> tuple[list[int], torch.Tensor]:
        """Residual codes of the last sampled codebook-0 id: the frame's 16 codes, and the
        sum of the frame's 16 codec embeddings [1, 1, D] (the next step's input before the text row)."""
        code0 = seq.codes0[-1]
        code0_embedding = self.module.get_input_embeddings()(torch.tensor([code0], device=self.device))
        frames, codec_sums = self.code_predictor.complete_frames(seq.last_hidden[0], code0_embedding, [code0],
                                                                 [seq.residual_sampler])
        return frames[0], codec_sums[:, None]

    @torch.no_grad()
    def decode(self, seq: TalkerSequence, next_input: torch.Tensor) -> int:
        """One talker step on `next_input` [1, 1, D]; returns the next codebook-0 id."""
        token = self._forward(seq, next_input, step_positions(seq.prompt_length + seq.steps, 1, seq.rope_delta))
        seq.steps += 1
        return token
