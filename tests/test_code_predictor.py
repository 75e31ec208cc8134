"""The code predictor run pass by pass (code_predictor.py) against transformers' own
`generate` and `forward` of the same module."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration as CodePredictorModule,
)

from vllm_omni.config import SamplingParams
from vllm_omni.engine.backends.torch_sampling import TokenSampler, choose_each
from vllm_omni.models.qwen3_omni.code_predictor import CodePredictor
from vllm_omni.models.qwen3_omni.tiny.config import tiny_config

GROUPS = 16


@pytest.fixture(scope="module")
def module() -> CodePredictorModule:
    torch.manual_seed(0)
    predictor = CodePredictorModule._from_config(tiny_config().talker_config.code_predictor_config).eval()
    with torch.no_grad():
        for parameter in predictor.parameters():  # wide weights: distinct logits, no argmax ties
            parameter.normal_(0.0, 0.5)
    return predictor


def _inputs(rows: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    generator = torch.Generator().manual_seed(rows)
    last_hidden = torch.randn(rows, dim, generator=generator)
    code0_embeddings = torch.randn(rows, dim, generator=generator)
    return last_hidden, code0_embeddings, list(range(100, 100 + rows))


def test_greedy_frames_and_codec_sums_equal_transformers_generate(module: CodePredictorModule) -> None:
    dim = module.config.hidden_size
    last_hidden, code0_embeddings, codes0 = _inputs(3, dim)
    greedy = [TokenSampler(SamplingParams(temperature=0.0)) for _ in codes0]
    frames, sums = CodePredictor(module, GROUPS).complete_frames(last_hidden, code0_embeddings, codes0, greedy)
    assert sums.shape == (3, dim)
    with torch.no_grad():
        for row in range(3):
            inputs = torch.stack((last_hidden[row], code0_embeddings[row]))[None]
            residual = module.generate(inputs_embeds=inputs, max_new_tokens=GROUPS - 1, do_sample=False)[0]
            assert frames[row] == [codes0[row], *residual.tolist()]
            embeddings = [code0_embeddings[row]] + [module.get_input_embeddings()[group](code)
                                                    for group, code in enumerate(residual)]
            assert torch.equal(sums[row], torch.stack(embeddings).sum(0))


def test_sampled_frames_equal_forward_with_each_rows_own_generator(module: CodePredictorModule) -> None:
    """Rows sample with their own seeded generators, as they would alone through `forward`."""
    last_hidden, code0_embeddings, codes0 = _inputs(2, module.config.hidden_size)

    def samplers() -> list[TokenSampler]:
        return [TokenSampler(SamplingParams(temperature=1.0, top_k=50, top_p=0.8, seed=seed)) for seed in (7, 8)]

    frames, _ = CodePredictor(module, GROUPS).complete_frames(last_hidden, code0_embeddings, codes0, samplers())
    with torch.no_grad():
        for row, sampler in enumerate(samplers()):
            cache = DynamicCache(config=module.config)
            out = module(inputs_embeds=torch.stack((last_hidden[row], code0_embeddings[row]))[None],
                         past_key_values=cache, use_cache=True)
            expected = [codes0[row]]
            for group in range(1, GROUPS):
                expected.append(sampler.choose(out.logits[0, -1].float()))
                if group + 1 < GROUPS:
                    out = module(input_ids=torch.tensor([[expected[-1]]]), generation_steps=group,
                                 past_key_values=cache, use_cache=True)
            assert frames[row] == expected
    assert frames[0] != frames[1]


def test_choose_each_takes_the_first_maximum_of_every_row_when_greedy() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0], [5.0, 1.0, 5.0], [0.0, 0.0, 1.0]])
    greedy = [TokenSampler(SamplingParams(temperature=0.0)) for _ in range(3)]
    assert choose_each(greedy, logits) == [greedy[0].choose(row) for row in logits] == [1, 0, 2]
