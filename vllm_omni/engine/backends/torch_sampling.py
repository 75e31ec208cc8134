"""Token choice for the torch backend: greedy at temperature 0, else seeded sampling."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_omni.config import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, previous: Sequence[int], penalty: float) -> torch.Tensor:
    """transformers' rule: divide positive logits of seen tokens by `penalty`, multiply negative."""
    if penalty == 1.0 or not previous:
        return logits
    ids = torch.tensor(sorted(set(previous)), dtype=torch.long, device=logits.device)
    seen = logits[ids]
    logits = logits.clone()
    logits[ids] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits


class TokenSampler:
    """Chooses one token from a logits row, per request (it owns the request's generator)."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self._generator = None
        if params.temperature > 0:
            self._generator = torch.Generator()
            if params.seed is not None:
                self._generator.manual_seed(params.seed)
            else:
                self._generator.seed()

    def choose(self, logits: torch.Tensor) -> int:
        """`logits`: [vocab] float, already penalised and masked, on any device. Sampling runs on
        the CPU, with the request's generator: a seed gives the same tokens on every device."""
        params = self.params
        if params.temperature == 0:
            return int(torch.argmax(logits))
        logits = logits.cpu().float() / params.temperature
        if params.top_k is not None and 0 < params.top_k < logits.numel():
            kth = torch.topk(logits, params.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            outside = sorted_probs.cumsum(0) - sorted_probs > params.top_p
            sorted_probs[outside] = 0.0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self._generator))


def choose_each(samplers: Sequence[TokenSampler], logits: torch.Tensor) -> list[int]:
    """One token per row of `logits` [R, vocab], row i by `samplers[i]`. All-greedy batches
    take one batched argmax, which picks what the per-row argmax does (the first maximum)."""
    if all(sampler.params.temperature == 0 for sampler in samplers):
        return logits.argmax(dim=-1).tolist()
    return [sampler.choose(row) for sampler, row in zip(samplers, logits, strict=True)]
