"""The code predictor: a frame's residual codebooks 1..15 from the talker's last hidden state
and its sampled codebook-0 id, for a batch of frames (qwen3-omni-pipeline.md §5).

It runs transformers' own code-predictor modules (layers, norm, heads, rotary embedding,
`DynamicCache`), but drives them directly instead of through the model's `forward`. That
`forward` builds a causal mask and captures outputs on every call, which costs about a third
of each of the 15 passes per frame at small sizes. Neither is needed here: the 2-row first
pass is plainly causal, and every later pass has a single query, so transformers' SDPA mask
is `None` in both cases. The logits are bit-identical to `forward`'s
(tests/test_code_predictor.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration as CodePredictorModule,
)

from vllm_omni.engine.backends.torch_sampling import TokenSampler, choose_each


class CodePredictor:
    def __init__(self, module: CodePredictorModule, num_code_groups: int):
        self.module = module
        self.num_code_groups = num_code_groups

    def _logits(self, inputs_embeds: torch.Tensor, cache: DynamicCache, head: int) -> torch.Tensor:
        """One pass over `inputs_embeds` [R, n, D] after the cache's rows: head `head`'s logits
        of the last row, [R, vocab] float."""
        model = self.module.model
        start = cache.get_seq_length()
        position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + start).unsqueeze(0)
        position_embeddings = model.rotary_emb(inputs_embeds, position_ids)
        hidden = inputs_embeds
        for layer in model.layers:
            hidden = layer(hidden, attention_mask=None, position_ids=position_ids, past_key_values=cache,
                           use_cache=True, position_embeddings=position_embeddings)
        # The head sees every row, as in `forward`: a matmul's rounding may depend on its shape.
        return self.module.lm_head[head](model.norm(hidden))[:, -1].float()

    @torch.no_grad()
    def complete_frames(self, last_hidden: torch.Tensor, code0_embeddings: torch.Tensor, codes0: Sequence[int],
                        samplers: Sequence[TokenSampler]) -> tuple[list[list[int]], torch.Tensor]:
        """`last_hidden` and `code0_embeddings` [R, D]: per frame, the talker's output state and
        its codebook-0 id's embedding. Returns each frame's 16 codes, and the sums of each
        frame's 16 codec embeddings, [R, D] (the next talker step's input before its text row)."""
        cache = DynamicCache(config=self.module.config)
        embeddings = [code0_embeddings]
        logits = self._logits(torch.stack((last_hidden, code0_embeddings), dim=1), cache, head=0)
        frames = [[code] for code in codes0]
        for group in range(1, self.num_code_groups):
            chosen = choose_each(samplers, logits)
            for frame, code in zip(frames, chosen, strict=True):
                frame.append(code)
            group_embeddings = self.module.get_input_embeddings()[group - 1](
                torch.tensor(chosen, device=last_hidden.device))
            embeddings.append(group_embeddings)
            if group + 1 < self.num_code_groups:
                logits = self._logits(group_embeddings[:, None], cache, head=group)
        # The reference sums the 16 embeddings at once (not a running sum): same rounding.
        return frames, torch.stack(embeddings, dim=1).sum(1)
