"""audio/pcm.py, the one home of raw audio: band-limited streaming resampling (no aliasing,
chunking changes nothing, nothing lost at the end), PCM16 and WAV conversions, and the
per-answer output encoder that keeps its resampler across an answer's chunks."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from vllm_omni.audio.formats import AudioFormat, InputConverter, OutputEncoder, encode_output
from vllm_omni.audio.pcm import (
    AudioDataError,
    StreamingResampler,
    float_to_pcm16_bytes,
    pcm16_to_float,
    read_wav,
    resample,
    wav_bytes,
)

RATE_PAIRS = [(24000, 16000), (16000, 24000), (24000, 8000), (8000, 16000), (44100, 16000), (48000, 16000)]


def tone(frequency: float, rate: int, seconds: float = 1.0, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * frequency * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


def rms_db(samples: np.ndarray, reference: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(samples ** 2)) / np.sqrt(np.mean(reference ** 2))))


def chunked(source_rate: int, target_rate: int, samples: np.ndarray, sizes: list[int]) -> np.ndarray:
    resampler, out, start = StreamingResampler(source_rate, target_rate), [], 0
    while start < samples.size:
        for size in sizes:
            out.append(resampler.process(samples[start:start + size]))
            start += size
    return np.concatenate([*out, resampler.flush()])


def test_a_10_khz_tone_at_24_khz_is_stopped_on_the_way_to_16_khz() -> None:
    """10 kHz is above 16 kHz's Nyquist: linear interpolation (the resampler before this one)
    folds it to 6 kHz at -2.7 dB; the band-limited resampler leaves less than -60 dB of it."""
    loud = tone(10000, 24000)
    assert rms_db(resample(loud, 24000, 16000)[200:-200], loud) < -60
    speech_band = tone(1000, 24000)
    assert abs(rms_db(resample(speech_band, 24000, 16000)[200:-200], speech_band)) < 0.01


@pytest.mark.parametrize(("source_rate", "target_rate"), RATE_PAIRS)
def test_chunked_output_equals_whole_buffer_output(source_rate: int, target_rate: int) -> None:
    samples = np.random.default_rng(7).uniform(-0.5, 0.5, source_rate // 2).astype(np.float32)
    whole = resample(samples, source_rate, target_rate)
    for sizes in ([source_rate // 50], [1, 7, 333, 4800], [3]):
        assert np.array_equal(chunked(source_rate, target_rate, samples, sizes), whole), sizes
    assert whole.size == -(-samples.size * target_rate // source_rate)  # flush gives back the held-back tail


@pytest.mark.parametrize(("source_rate", "target_rate"), RATE_PAIRS)
def test_the_output_lines_up_with_the_input(source_rate: int, target_rate: int) -> None:
    """The filter's delay is taken back out: a tone comes out where it went in."""
    frequency = 0.2 * min(source_rate, target_rate)
    out = resample(tone(frequency, source_rate), source_rate, target_rate)
    expected = tone(frequency, target_rate)[:out.size]
    assert np.abs(out - expected)[300:-300].max() < 1e-3


def test_a_flushed_stream_takes_no_more_input() -> None:
    resampler = StreamingResampler(24000, 16000)
    resampler.process(tone(440, 24000, 0.1))
    resampler.flush()
    with pytest.raises(RuntimeError, match="flushed"):
        resampler.process(tone(440, 24000, 0.1))


def test_the_session_input_converter_streams_like_one_resampler() -> None:
    pcm24 = float_to_pcm16_bytes(tone(300, 24000))
    converter = InputConverter()
    pieces = [converter.convert(pcm24[i:i + 960], AudioFormat("pcm16", 24000)) for i in range(0, len(pcm24), 960)]
    assert np.array_equal(np.concatenate(pieces), StreamingResampler(24000, 16000).process(pcm16_to_float(pcm24)))


def test_an_answer_encoded_chunk_by_chunk_equals_it_encoded_whole() -> None:
    """The output side keeps one resampler per answer (a new one per chunk would click at
    every chunk boundary), and the answer's last chunk flushes it."""
    answer = float_to_pcm16_bytes(tone(440, 24000, 0.5, 0.3))
    for name in ("g711_ulaw", "g711_alaw"):
        fmt = AudioFormat(name, 8000)
        encoder, cuts = OutputEncoder(fmt), list(range(0, len(answer), 1922)) + [len(answer)]
        pieces = [encoder.encode(answer[a:b], 24000, final=b == len(answer))[0] for a, b in pairwise(cuts)]
        whole, rate = encode_output(answer, 24000, fmt)
        assert rate == 8000 and b"".join(pieces) == whole and len(whole) == 4000


def test_pcm16_and_wav_round_trip_and_bad_files_are_named() -> None:
    samples = tone(440, 16000, 0.1)
    pcm = float_to_pcm16_bytes(samples)
    assert np.abs(pcm16_to_float(pcm) - samples).max() <= 1 / 32767
    decoded, rate = read_wav(wav_bytes(pcm, 16000))
    assert rate == 16000 and np.array_equal(decoded, pcm16_to_float(pcm))
    with pytest.raises(AudioDataError, match="even number of bytes"):
        pcm16_to_float(b"\x01\x02\x03")
    with pytest.raises(AudioDataError, match="not an uncompressed PCM WAV file"):
        read_wav(b"RIFF....not a wave")
