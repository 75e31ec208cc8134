"""MiniCPM-o's streaming mel front end: units close on the 1030/1000 ms grid, any append sizes
give the same chunks, and every chunk equals Whisper's log-mel of all audio received so far
(the reference's "exact" mode), with the fixed floor before 5 s and the dynamic one after."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import spectrogram, window_function

from tests.conftest import read_fixture_pcm
from vllm_omni.models.minicpmo.mel_stream import StreamingMel, unit_close_samples


def whole_buffer_mel(samples: np.ndarray) -> np.ndarray:
    """The reference: Whisper's log-mel of the whole buffer (centred, reflect-padded, last frame
    dropped), floored at -10 before 5 s and at max - 8 after, scaled (x + 4) / 4."""
    filters = WhisperFeatureExtractor(feature_size=80).mel_filters
    raw = spectrogram(samples, window_function(400, "hann"), frame_length=400, hop_length=160, power=2.0,
                      mel_filters=filters, log_mel="log10")[:, :-1]
    floor = -10.0 if samples.size < 5 * 16000 else raw.max() - 8.0
    return (np.maximum(raw, floor) + 4.0) / 4.0


def unit_frames(unit: int) -> slice:
    return slice(100 * unit - (2 if unit else 0), 100 * unit + 102)


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    samples = read_fixture_pcm("speech_en_long.wav")
    assert samples.size > unit_close_samples(6)
    return samples


def test_units_close_on_the_1030_1000_ms_grid() -> None:
    mel = StreamingMel()
    tone = (0.1 * np.sin(np.arange(unit_close_samples(1)) * 0.05)).astype(np.float32)
    assert mel.append(tone[: unit_close_samples(0) - 1]) == []
    (first,) = mel.append(tone[unit_close_samples(0) - 1: unit_close_samples(0)])
    assert first.shape == (80, 102)
    assert mel.append(tone[unit_close_samples(0): unit_close_samples(1) - 1]) == []
    (second,) = mel.append(tone[unit_close_samples(1) - 1:])
    assert second.shape == (80, 104)
    np.testing.assert_array_equal(second[:, :4], first[:, -4:])  # the redundancy frames overlap


def test_any_append_sizes_give_the_same_chunks(speech: np.ndarray) -> None:
    at_once = StreamingMel().append(speech)
    rng = np.random.default_rng(0)
    mel, pieces, position = StreamingMel(), [], 0
    while position < speech.size:
        size = int(rng.integers(1, 5000))
        pieces += mel.append(speech[position: position + size])
        position += size
    assert len(pieces) == len(at_once) == (speech.size - 16480) // 16000 + 1
    for streamed, whole in zip(pieces, at_once, strict=True):
        np.testing.assert_array_equal(streamed, whole)


def test_every_chunk_is_whisper_mel_of_the_audio_heard_so_far(speech: np.ndarray) -> None:
    mel = StreamingMel()
    for unit in range(7):  # units 0-4 close before 5 s (fixed floor), 5-6 after (dynamic floor)
        (chunk,) = mel.append(speech[mel.received: unit_close_samples(unit)])
        expected = whole_buffer_mel(speech[: unit_close_samples(unit)])[:, unit_frames(unit)]
        np.testing.assert_allclose(chunk, expected, atol=1e-5)
