"""Qwen2.5-Omni's token2wav streamed in windows (torch_backend/token2wav.py).

One window over the whole answer is transformers' token2wav exactly (same seed). Streamed
windows cannot be, by architecture: the ODE runs the DiT 36 times, so every frame of a one-shot
decode depends on every code, while a window sees its left context and one look-ahead block.
What holds: the streamed audio's log-mel is much closer to the one-shot decode's than another
seed's one-shot decode is, and the stream's output never depends on how its codes arrived.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.audio_utils import mel_filter_bank

from vllm_omni.audio.pcm import float_to_pcm16
from vllm_omni.models.qwen2_5_omni.checkpoint import Qwen25OmniCheckpoint, load_checkpoint
from vllm_omni.models.qwen2_5_omni.torch_backend.token2wav import Token2WavStream, Windows, solve_windows

STREAMED = Windows(first=12, most=48, left_context=24, vocoder_context_frames=16)
ONE_SHOT = Windows(first=12, most=48, left_context=24, vocoder_context_frames=16, one_shot=True)
MEL_BANK = torch.from_numpy(mel_filter_bank(num_frequency_bins=513, num_mel_filters=80, min_frequency=0.0,
                                            max_frequency=12000.0, sampling_rate=24000, norm="slaney",
                                            mel_scale="slaney")).float()


def log_mel(samples: np.ndarray) -> torch.Tensor:
    power = torch.stft(torch.from_numpy(samples).float(), n_fft=1024, hop_length=256, window=torch.hann_window(1024),
                       return_complex=True).abs() ** 2
    return torch.log(torch.clamp(MEL_BANK.T @ power, min=1e-5))


def log_mel_distance(a: np.ndarray, b: np.ndarray) -> float:
    return float((log_mel(a) - log_mel(b)).abs().mean())


@pytest.fixture(scope="module")
def checkpoint(qwen2_5_omni_checkpoint: Path) -> Qwen25OmniCheckpoint:
    return load_checkpoint(qwen2_5_omni_checkpoint)


def codes(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 8192, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def decode(checkpoint: Qwen25OmniCheckpoint, windows: Windows, all_codes: list[int], seed: int,
           arrivals: int | None = None, voice: str = "chelsie") -> np.ndarray:
    """The stream's samples with codes arriving `arrivals` at a time (None: all at once, final)."""
    stream = Token2WavStream(checkpoint.token2wav, checkpoint.voices[voice], seed, windows)
    pieces = []
    step = arrivals or len(all_codes)
    for start in range(0, len(all_codes), step):
        stream.add(all_codes[start:start + step], final=start + step >= len(all_codes))
        while stream.ready():
            pieces.append(stream.step().numpy())
    assert stream.finished
    return np.concatenate(pieces)


def test_one_window_is_transformers_token2wav(checkpoint: Qwen25OmniCheckpoint) -> None:
    answer = codes(70)
    voice = checkpoint.voices["chelsie"]
    torch.manual_seed(3)
    with torch.no_grad():
        expected = checkpoint.token2wav(torch.tensor([answer]), conditioning=voice.conditioning,
                                        reference_mel=voice.reference_mel).reshape(-1).numpy()
    ours = decode(checkpoint, ONE_SHOT, answer, seed=3)
    assert ours.shape == expected.shape == (70 * 2 * 240,)
    assert np.abs(float_to_pcm16(ours).astype(int) - float_to_pcm16(expected).astype(int)).max() <= 1


def test_streamed_output_does_not_depend_on_arrivals(checkpoint: Qwen25OmniCheckpoint) -> None:
    answer = codes(101, seed=1)
    whole = decode(checkpoint, STREAMED, answer, seed=0)
    for arrivals in (1, 7, 40):
        np.testing.assert_array_equal(decode(checkpoint, STREAMED, answer, seed=0, arrivals=arrivals), whole)


def test_streamed_against_one_shot(checkpoint: Qwen25OmniCheckpoint) -> None:
    answer = codes(150, seed=2)
    one_shot = decode(checkpoint, ONE_SHOT, answer, seed=0)
    streamed = decode(checkpoint, STREAMED, answer, seed=0, arrivals=5)
    other_seed = decode(checkpoint, ONE_SHOT, answer, seed=1)
    assert streamed.shape == one_shot.shape
    spectral = log_mel_distance(streamed, one_shot)
    seed_to_seed = log_mel_distance(other_seed, one_shot)
    lsb = np.abs(float_to_pcm16(streamed).astype(int) - float_to_pcm16(one_shot).astype(int)).max()
    print(f"streamed vs one shot: log-mel {spectral:.3f}, max {lsb} LSB; one shot, other seed: log-mel "
          f"{seed_to_seed:.3f}")
    assert spectral < 0.5 * seed_to_seed


def test_streams_solved_in_one_batch_equal_each_alone(checkpoint: Qwen25OmniCheckpoint) -> None:
    """Two answers in different voices, their windows solved together (`solve_windows`, as the
    batched program does): each within 1 LSB of its stream alone."""
    answers = {"chelsie": codes(90, seed=4), "ethan": codes(90, seed=5)}
    alone = {voice: decode(checkpoint, STREAMED, answer, seed=0, voice=voice) for voice, answer in answers.items()}
    streams = {voice: Token2WavStream(checkpoint.token2wav, checkpoint.voices[voice], 0, STREAMED) for voice in answers}
    pieces: dict[str, list[np.ndarray]] = {voice: [] for voice in answers}
    for start in range(0, 90, 10):
        for voice, stream in streams.items():
            stream.add(answers[voice][start:start + 10], final=start + 10 >= 90)
        while any(stream.ready() for stream in streams.values()):
            ready = [voice for voice, stream in streams.items() if stream.next_window() is not None]
            solve_windows([streams[v] for v in ready], [streams[v].next_window() for v in ready])
            for voice, stream in streams.items():
                pieces[voice].append(stream.vocode().numpy())
    for voice in answers:
        batched = np.concatenate(pieces[voice])
        assert batched.shape == alone[voice].shape
        assert np.abs(float_to_pcm16(batched).astype(int) - float_to_pcm16(alone[voice]).astype(int)).max() <= 1
    assert np.abs(alone["chelsie"] - alone["ethan"]).max() * 32768 > 100  # different voices and codes
