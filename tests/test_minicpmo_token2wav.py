"""Token2wav (Stage 2) on the tiny checkpoint's random instance of the real networks
(docs/minicpmo.md, "Token2wav"): chunking and length rules, voices, sessions, determinism, and
how close the streamed chunks come to the one-pass output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni.models.minicpmo.tiny.token2wav import build_tiny_token2wav
from vllm_omni.models.minicpmo.token2wav import ASSETS_DIR, SAMPLE_RATE, Token2Wav
from vllm_omni.models.minicpmo.token2wav_prompt import prompt_mel
from vllm_omni.models.minicpmo.token2wav_stream import OVERLAP, SILENCE_CODE, TURN_PREFIX

SECOND = SAMPLE_RATE  # 25 codes


def _reference(freq: float, rate: int = 16000, seconds: float = 2.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def _codes(count: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 6561, count).tolist()


def _stream_turn(model: Token2Wav, voice, codes: list[int], step: int = 7) -> list[np.ndarray]:
    stream = model.stream(voice)
    pieces = [stream.push(codes[i:i + step]) for i in range(0, len(codes), step)]
    return [*pieces, stream.finish()]


def _log_mel(samples: np.ndarray) -> np.ndarray:
    return prompt_mel(samples.astype(np.float32)).numpy()


@pytest.fixture(scope="module")
def model(minicpmo_checkpoint: Path) -> Token2Wav:
    return Token2Wav.from_checkpoint(minicpmo_checkpoint)


@pytest.fixture(scope="module")
def voice(model: Token2Wav):
    return model.voice(_reference(220.0), 16000)


def test_missing_assets_name_the_files(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="flow.yaml, flow.pt, hift.pt"):
        Token2Wav.from_checkpoint(tmp_path)
    (tmp_path / ASSETS_DIR).mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / ASSETS_DIR)):
        Token2Wav.from_checkpoint(tmp_path)


def test_tiny_assets_same_seed_same_bytes(minicpmo_checkpoint: Path, tmp_path: Path):
    built = minicpmo_checkpoint / ASSETS_DIR
    again = build_tiny_token2wav(tmp_path / "again", seed=0)
    names = sorted(path.name for path in built.iterdir())
    assert names == sorted(path.name for path in again.iterdir())
    assert {"flow.yaml", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v2_25hz.onnx"} <= set(names)
    for name in names:
        assert (again / name).read_bytes() == (built / name).read_bytes(), name
    other = build_tiny_token2wav(tmp_path / "other", seed=1)
    assert (other / "flow.pt").read_bytes() != (built / "flow.pt").read_bytes()


def test_voice_prompt_shapes(model: Token2Wav, voice):
    prompt = voice.prompt
    assert prompt.codes.shape == (1, 50)  # 2 s at 25 codes/s
    assert int(prompt.codes.min()) >= 0 and int(prompt.codes.max()) < 6561
    assert prompt.mel.shape == (1, 100, 80)  # two mel frames per code
    assert prompt.speaker.shape == (1, 192)
    # A 24 kHz reference of the same sound gives the same prompt codes' length and mel size.
    voice24 = model.voice(_reference(220.0, rate=24000), 24000)
    assert voice24.prompt.codes.shape == prompt.codes.shape and voice24.prompt.mel.shape == prompt.mel.shape


def test_chunk_lengths(model: Token2Wav, voice):
    """With the turn's 3 silence codes, every 25 codes pushed complete a chunk of exactly 1 s
    (the first led by 3840 zeros); the rest comes with finish()."""
    stream = model.stream(voice)
    assert stream.buffer == [SILENCE_CODE] * TURN_PREFIX
    assert stream.push(_codes(24)).size == 0
    first = stream.push(_codes(1, seed=1))
    assert first.shape == (SECOND,) and first.dtype == np.float32
    assert not first[:OVERLAP].any() and first[OVERLAP:].any()
    assert stream.push(_codes(25, seed=2)).shape == (SECOND,)
    # 3 look-ahead codes remain: 6 mel frames, plus the 8 frames of held-back context.
    assert len(stream.buffer) == 3
    assert stream.finish().shape == (3 * 960 + OVERLAP,)
    assert stream.buffer == [SILENCE_CODE] * TURN_PREFIX  # the next turn has started


def test_flush_vocodes_short_chunks(model: Token2Wav, voice):
    stream = model.stream(voice)
    assert stream.push(_codes(4), flush=True).size == 0  # 3 + 4 < 3 look-ahead + 5
    assert stream.push(_codes(1), flush=True).shape == (5 * 960,)  # 8 buffered: 5 codes vocoded
    assert len(stream.buffer) == 3


def test_turn_audio_length_and_reset(model: Token2Wav, voice):
    codes = _codes(60)
    turn = np.concatenate(_stream_turn(model, voice, codes))
    assert turn.shape == (OVERLAP + (TURN_PREFIX + len(codes)) * 960,)
    assert np.abs(turn).max() <= 1.0
    stream = model.stream(voice)
    stream.push(codes)
    stream.finish()  # the next turn starts from the voice's flow caches
    for name, cache in voice.flow_cache.items():
        assert torch.equal(stream._flow_cache[name], cache), name


def test_deterministic(model: Token2Wav, voice, minicpmo_checkpoint: Path):
    codes = _codes(40)
    once = np.concatenate(_stream_turn(model, voice, codes))
    reloaded = Token2Wav.from_checkpoint(minicpmo_checkpoint)
    twice = np.concatenate(_stream_turn(reloaded, reloaded.voice(_reference(220.0), 16000), codes))
    np.testing.assert_array_equal(once, twice)


def test_chunking_of_pushes_does_not_matter(model: Token2Wav, voice):
    codes = _codes(60)
    np.testing.assert_array_equal(np.concatenate(_stream_turn(model, voice, codes, step=1)),
                                  np.concatenate(_stream_turn(model, voice, codes, step=60)))


def test_voices_differ(model: Token2Wav, voice):
    other = model.voice(_reference(140.0), 16000)
    assert not torch.equal(voice.prompt.speaker, other.prompt.speaker)
    codes = _codes(50)
    ours, theirs = (np.concatenate(_stream_turn(model, v, codes)) for v in (voice, other))
    assert np.abs(ours - theirs).max() * 32768 > 100


def test_interleaved_sessions_equal_each_alone(model: Token2Wav, voice):
    other = model.voice(_reference(140.0), 16000)
    codes_a, codes_b = _codes(55, seed=3), _codes(55, seed=4)
    alone_a = np.concatenate(_stream_turn(model, voice, codes_a, step=11))
    alone_b = np.concatenate(_stream_turn(model, other, codes_b, step=11))
    a, b = model.stream(voice), model.stream(other)
    out_a, out_b = [], []
    for i in range(0, 55, 11):
        out_a.append(a.push(codes_a[i:i + 11]))
        out_b.append(b.push(codes_b[i:i + 11]))
    out_b.append(b.finish())
    out_a.append(a.finish())
    np.testing.assert_array_equal(np.concatenate(out_a), alone_a)
    np.testing.assert_array_equal(np.concatenate(out_b), alone_b)


def test_streamed_against_one_pass(model: Token2Wav, voice):
    """Streamed chunks cannot equal the one-pass output sample for sample, by architecture
    (docs/minicpmo.md, "Token2wav", "Parity"): HiFT's excitation is drawn at random per call
    (two one-pass runs with different seeds differ as much), the streamed flow model attends
    chunk-causally where the one pass attends to the whole utterance, and from the 4th chunk on
    the streaming caches are windowed. What holds is the spectrum: the streamed audio's log-mel
    is as close to the one pass's as another one-pass draw is."""
    codes = _codes(97)  # with the 3 silence codes: 4 chunks
    streamed = np.concatenate(_stream_turn(model, voice, codes))
    assert not streamed[:OVERLAP].any()
    streamed = streamed[OVERLAP:]
    one_pass = model.inference(voice, codes, seed=0)
    other_draw = model.inference(voice, codes, seed=1)
    assert streamed.shape == one_pass.shape == ((TURN_PREFIX + len(codes)) * 960,)
    np.testing.assert_array_equal(one_pass, model.inference(voice, codes, seed=0))
    lsb = np.abs(streamed - one_pass).max() * 32768
    draw_lsb = np.abs(other_draw - one_pass).max() * 32768
    spectral = np.abs(_log_mel(streamed) - _log_mel(one_pass)).mean()
    draw_spectral = np.abs(_log_mel(other_draw) - _log_mel(one_pass)).mean()
    print(f"streamed vs one pass: max {lsb:.0f} LSB, log-mel {spectral:.3f}; "
          f"one pass, other seed: max {draw_lsb:.0f} LSB, log-mel {draw_spectral:.3f}")
    assert spectral < 1.5 * draw_spectral
