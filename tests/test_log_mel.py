"""Streaming log-mel features equal transformers' WhisperFeatureExtractor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from tests.conftest import read_fixture_pcm
from vllm_omni.audio.log_mel import StreamingLogMel, log_mel_features


@pytest.fixture(scope="module")
def whisper() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400,
                                   chunk_length=300, padding_value=0.0, dither=0.0)


def reference(extractor: WhisperFeatureExtractor, samples: np.ndarray) -> torch.Tensor:
    return extractor(samples, sampling_rate=16000, padding=True, truncation=False,
                     return_tensors="pt")["input_features"][0]


@pytest.mark.parametrize("name", ["speech_en_single.wav", "speech_en_long.wav", "silence_2s.wav"])
def test_one_shot_equals_whisper(whisper, name: str) -> None:
    samples = read_fixture_pcm(name)
    expected = reference(whisper, samples)
    assert torch.allclose(log_mel_features(samples), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_in_random_pieces_equals_one_shot(whisper, seed: int) -> None:
    samples = read_fixture_pcm("speech_en_long.wav")[: 16000 * 7 + 123]  # not a whole 10 ms hop
    rng = np.random.default_rng(seed)
    mel = StreamingLogMel()
    position = 0
    while position < len(samples):
        size = int(rng.integers(1, 4000))
        mel.append(samples[position:position + size])
        position += size
    mel.finish()
    expected = reference(whisper, samples)
    assert mel.features().shape == expected.shape == (128, len(samples) // 160)
    assert torch.allclose(mel.features(), expected, atol=1e-6, rtol=0)


def test_frames_are_computed_while_audio_arrives() -> None:
    mel = StreamingLogMel()
    mel.append(np.zeros(16000, dtype=np.float32) + 0.01)
    done_early = mel._num_final_frames  # noqa: SLF001
    assert done_early == 99  # frame i is final once 160 i + 200 samples exist
    mel.finish()
    assert mel._num_final_frames == 100  # noqa: SLF001


def test_features_before_finish_and_too_short_audio_are_errors() -> None:
    mel = StreamingLogMel()
    mel.append(np.zeros(960, dtype=np.float32))  # the last frame reaches past the end
    with pytest.raises(RuntimeError, match="finish"):
        mel.features()
    short = StreamingLogMel()
    short.append(np.zeros(100, dtype=np.float32))
    with pytest.raises(ValueError, match="too short"):
        short.finish()


@pytest.mark.parametrize("length", [201, 300, 359, 1600])
def test_tiny_appends_equal_one_shot(whisper, length: int) -> None:
    """Frame 0 reflects sample 200: 20-sample appends that reach just past it used to fail
    ("padding size") where one append of the same audio did not."""
    samples = read_fixture_pcm("speech_en_single.wav")[16000: 16000 + length]
    mel = StreamingLogMel()
    for start in range(0, length, 20):
        mel.append(samples[start:start + 20])
    mel.finish()
    assert torch.allclose(mel.features(), reference(whisper, samples), atol=1e-6, rtol=0)
