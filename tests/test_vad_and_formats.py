"""Silero VAD endpointing on the audio fixtures, and the audio format conversions."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from tests.conftest import DATA, read_fixture_pcm
from vllm_omni.audio.formats import (
    AudioDataError,
    AudioFormat,
    AudioFormatError,
    InputConverter,
    decode_base64,
    encode_output,
)
from vllm_omni.audio.pcm import StreamingResampler
from vllm_omni.audio.silero_vad import (
    SILERO_SHA256,
    ServerVADUnavailableError,
    SileroModel,
    VadConfig,
    VadDetector,
    resolve_silero_model,
    samples_to_ms,
)


def silero_probs() -> dict:
    return json.loads((DATA / "silero_frame_probs.json").read_text())["probs"]


def segments(name: str) -> list[tuple[int, int]]:
    samples = read_fixture_pcm(name)
    detector = VadDetector(SileroModel.load(), VadConfig())
    found, start = [], None
    for i in range(0, len(samples), 1600):
        result = detector.feed(samples[i:i + 1600])
        if result.started:
            start = samples_to_ms(result.start_sample)
        if result.stopped:
            found.append((start, samples_to_ms(result.end_sample)))
        if result.should_commit:
            detector.reset()
    return found


def test_the_packaged_model_is_the_pinned_artifact() -> None:
    path = resolve_silero_model(None)
    assert path.name == "silero_vad.onnx"
    import hashlib

    assert hashlib.sha256(path.read_bytes()).hexdigest() == SILERO_SHA256


def test_a_missing_configured_model_is_an_error(tmp_path) -> None:
    with pytest.raises(ServerVADUnavailableError, match="does not exist"):
        resolve_silero_model(str(tmp_path / "nope.onnx"))
    wrong = tmp_path / "wrong.onnx"
    wrong.write_bytes(b"not a model")
    with pytest.raises(ServerVADUnavailableError, match="checksum"):
        resolve_silero_model(str(wrong))


def test_frame_probabilities_follow_the_measured_ones() -> None:
    samples = read_fixture_pcm("speech_en_single.wav")
    model = SileroModel.load()
    state, context, ours = np.zeros((2, 1, 128), np.float32), np.zeros(64, np.float32), []
    for i in range(len(samples) // 512):
        frame = samples[i * 512:(i + 1) * 512]
        p, state = model.score(np.concatenate([context, frame])[None], state)
        context = frame[-64:]
        ours.append(p)
    reference = silero_probs()["speech_en_single.wav"][: len(ours)]
    assert np.abs(np.array(ours) - np.array(reference)).max() < 0.02


@pytest.mark.parametrize(("name", "expected"), [
    ("speech_en_single.wav", 1), ("speech_en_two_turns.wav", 2), ("speech_with_pause.wav", 1),
    ("speech_en_long.wav", 1), ("noise_only.wav", 0), ("silence_2s.wav", 0),
])
def test_turns_found_in_the_fixtures(name: str, expected: int) -> None:
    assert len(segments(name)) == expected


def test_onset_and_end_times() -> None:
    (start, end), = segments("speech_en_single.wav")
    # Speech is measured from 512 ms (three frames over 0.5); prefix padding reaches 300 ms back.
    assert start == 512 - 300
    # Silero's own segment ends at 3678 ms; the stop adds the 500 ms silence window.
    assert 3678 + 400 <= end <= 3678 + 600


def test_base64_is_strict() -> None:
    assert decode_base64(base64.b64encode(b"\x01\x02").decode()) == b"\x01\x02"
    for bad in ("***", "AQI", "AQ I="):
        with pytest.raises(AudioDataError):
            decode_base64(bad)


def test_input_conversion_resamples_24k_like_the_whole_stream() -> None:
    samples = read_fixture_pcm("speech_en_single.wav")[:16000]
    pcm24 = (np.interp(np.arange(24000) * 16000 / 24000, np.arange(16000), samples) * 32767).astype("<i2")
    converter = InputConverter()
    pieces = [converter.convert(pcm24[i:i + 2400].tobytes(), AudioFormat("pcm16", 24000))
              for i in range(0, 24000, 2400)]
    whole = StreamingResampler(24000, 16000).process(pcm24.astype(np.float32) / 32768)
    joined = np.concatenate(pieces)
    assert np.array_equal(joined, whole)
    with pytest.raises(AudioDataError, match="odd"):
        converter.convert(b"\x01\x02\x03", AudioFormat("pcm16", 24000))
    with pytest.raises(AudioFormatError, match="rate changed from 24000 to 16000"):  # its filter state is 24 kHz
        converter.convert(pcm24[:2400].tobytes(), AudioFormat("pcm16", 16000))


def test_g711_output_round_trips_through_input() -> None:
    tone = (0.3 * np.sin(np.arange(2400) * 2 * np.pi * 440 / 24000) * 32767).astype("<i2").tobytes()
    for name in ("g711_ulaw", "g711_alaw"):
        data, rate = encode_output(tone, 24000, AudioFormat(name, 8000))
        assert rate == 8000 and len(data) == 800
        back = InputConverter().convert(data, AudioFormat(name, 8000))
        assert np.abs(back).max() == pytest.approx(0.3, abs=0.03)
    wav, rate = encode_output(tone, 24000, AudioFormat("wav", 24000))
    assert wav[:4] == b"RIFF" and rate == 24000
