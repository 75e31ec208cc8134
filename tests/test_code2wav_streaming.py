"""Exact streaming code2wav equals a one-shot decode at any chunk size."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from vllm_omni.audio.pcm import float_to_pcm16
from vllm_omni.models.qwen3_omni.torch_backend.code2wav import make_code2wav_stream

FRAMES = 120


@pytest.fixture(scope="module")
def code2wav(tiny_loaded):
    """The tiny vocoder with its transformer's layer scales at 1, so attention matters."""
    decoder = copy.deepcopy(tiny_loaded.code2wav)
    with torch.no_grad():
        for layer in decoder.pre_transformer.layers:
            layer.self_attn_layer_scale.scale.fill_(1.0)
            layer.mlp_layer_scale.scale.fill_(1.0)
    return decoder


@pytest.fixture(scope="module")
def codes() -> torch.Tensor:
    return torch.randint(0, 2048, (16, FRAMES), generator=torch.Generator().manual_seed(0))


def stream(decoder, codes: torch.Tensor, first: int, later: int, mode: str) -> torch.Tensor:
    state = make_code2wav_stream(decoder, mode, left_context=25)
    pieces, start, size = [], 0, first
    while start < codes.shape[1]:
        pieces.append(state.decode(codes[:, start:start + size]))
        start, size = start + size, later
    return torch.cat(pieces)


@pytest.mark.parametrize(("first", "later"), [(1, 1), (4, 25), (25, 25), (7, 13), (FRAMES, FRAMES)])
def test_exact_stream_equals_one_shot(code2wav, codes, first: int, later: int) -> None:
    with torch.no_grad():
        one_shot = code2wav(codes[None]).reshape(-1)
    streamed = stream(code2wav, codes, first, later, "exact")
    assert streamed.shape == one_shot.shape == (FRAMES * 1920 - 555,)
    assert (streamed - one_shot).abs().max() < 1e-5
    pcm_diff = float_to_pcm16(streamed.numpy()).astype(int) - float_to_pcm16(one_shot.numpy()).astype(int)
    assert np.abs(pcm_diff).max() <= 1


def test_left_context_reference_tiles_but_only_approximates(code2wav, codes) -> None:
    with torch.no_grad():
        one_shot = code2wav(codes[None]).reshape(-1)
    approximate = stream(code2wav, codes, 4, 25, "left_context")
    assert approximate.shape == one_shot.shape
    head = 4 * 1920 - 555  # the first chunk starts at frame 0, so it is exact
    assert torch.allclose(approximate[:head], one_shot[:head], atol=1e-5)
    assert (approximate - one_shot).abs().max() > 1e-2  # 25 frames of context miss the receptive field


def test_unknown_mode_is_an_error(code2wav) -> None:
    with pytest.raises(ValueError, match="unknown code2wav streaming mode"):
        make_code2wav_stream(code2wav, "magic")
