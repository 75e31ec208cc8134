"""MiniCPM-o's streaming audio encoder on the tiny checkpoint: unit by unit it equals encoding
the whole clip at once with a 1 s chunk-causal mask (transformers' own encoder layers), gives
10 rows per unit, starts its cache over at 30 s, and hears what it is given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.conftest import read_fixture_pcm
from tests.test_minicpmo_mel_stream import whole_buffer_mel
from vllm_omni.models.minicpmo.audio_encoder import AudioEncoderState, StreamingAudioEncoder
from vllm_omni.models.minicpmo.mel_stream import StreamingMel, unit_close_samples

UNITS = 4  # 4.03 s: every chunk under the fixed mel floor, so whole-clip and streamed mels agree


@pytest.fixture(scope="module")
def encoder(minicpmo_checkpoint: Path) -> StreamingAudioEncoder:
    return StreamingAudioEncoder.from_checkpoint(minicpmo_checkpoint)


def streamed_rows(encoder: StreamingAudioEncoder, samples: np.ndarray) -> list[torch.Tensor]:
    state, rows = AudioEncoderState(), []
    for unit, chunk in enumerate(StreamingMel().append(samples)):
        rows.append(encoder.encode_unit(torch.from_numpy(chunk), state, first=unit == 0))
    return rows


@torch.no_grad()
def whole_clip_rows(encoder: StreamingAudioEncoder, mel: np.ndarray, units: int) -> torch.Tensor:
    """The reference: the stem over the whole mel, positions from 0, transformers' encoder
    layers with a mask letting each second's frames see that second and every earlier one."""
    apm = encoder.apm
    conv = nn.functional.gelu(apm.conv2(nn.functional.gelu(apm.conv1(torch.from_numpy(mel)[None]))))[0].T
    hidden = conv[: 50 * units] + apm.embed_positions.weight[: 50 * units]
    second = torch.arange(50 * units) // 50
    mask = torch.where(second[None, :] <= second[:, None], 0.0, float("-inf"))[None, None]
    hidden = hidden[None]
    for layer in apm.layers:
        hidden = layer(hidden, mask)
    rows = encoder.audio_projection_layer(apm.layer_norm(hidden[0]))
    return encoder.pool(rows.T[None])[0].T


def test_streaming_equals_the_whole_clip_with_a_chunk_causal_mask(encoder: StreamingAudioEncoder) -> None:
    samples = read_fixture_pcm("speech_en_single.wav")[: unit_close_samples(UNITS - 1)]
    streamed = torch.cat(streamed_rows(encoder, samples))
    assert streamed.shape == (10 * UNITS, 128)
    reference = whole_clip_rows(encoder, whole_buffer_mel(samples), UNITS)
    difference = (streamed - reference).abs().max().item()
    assert difference < 1e-4, difference
    assert torch.nn.functional.cosine_similarity(streamed, reference).min() > 0.9999


def test_the_encoder_hears_what_it_is_given(encoder: StreamingAudioEncoder) -> None:
    close = unit_close_samples(1)
    speech = streamed_rows(encoder, read_fixture_pcm("speech_en_single.wav")[:close])
    noise = streamed_rows(encoder, read_fixture_pcm("noise_only.wav")[:close])
    silence = streamed_rows(encoder, np.zeros(close, dtype=np.float32))
    for a, b in ((speech, noise), (speech, silence), (noise, silence)):
        assert (a[1] - b[1]).abs().max() > 1e-2


def test_the_cache_starts_over_at_30_seconds(encoder: StreamingAudioEncoder) -> None:
    rng = np.random.default_rng(0)
    samples = (0.05 * rng.standard_normal(unit_close_samples(31))).astype(np.float32)
    state, cached = AudioEncoderState(), []
    for unit, chunk in enumerate(StreamingMel().append(samples)):
        rows = encoder.encode_unit(torch.from_numpy(chunk), state, first=unit == 0)
        assert rows.shape == (10, 128)
        cached.append(state.cached_frames)
    assert cached[:3] == [50, 100, 150] and max(cached) == 1450  # 29 units of 50 frames, then it starts over
    assert cached[29] == 50 and cached[31] == 150
