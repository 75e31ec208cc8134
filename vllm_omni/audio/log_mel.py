"""Whisper-style log-mel features, computed incrementally while audio streams in.

Qwen3-Omni's processor uses WhisperFeatureExtractor: 400-sample periodic Hann window, 160
hop, centred STFT (reflect padding of 200 samples), power spectrum, 128 Slaney mel bins,
log10, then an utterance-global floor `max(x, x.max() - 8)` and `(x + 4) / 4`; the last
STFT frame is dropped, so L samples give L // 160 frames.

Frame i covers samples [160 i - 200, 160 i + 200), so it is final once 160 i + 200 samples
have arrived (frame 0 reflects x[1:201]). Raw log10 values are kept per frame; the global
floor and scaling are applied when features are read, so the result equals the one-shot
extractor whatever the arrival pattern.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.audio_utils import mel_filter_bank

from vllm_omni.audio.pcm import MODEL_RATE

N_FFT = 400
HOP = 160
HALF_WINDOW = N_FFT // 2
N_MELS = 128


def _whisper_mel_filters() -> torch.Tensor:
    filters = mel_filter_bank(num_frequency_bins=1 + N_FFT // 2, num_mel_filters=N_MELS,
                              min_frequency=0.0, max_frequency=8000.0, sampling_rate=MODEL_RATE,
                              norm="slaney", mel_scale="slaney")
    return torch.from_numpy(filters).to(torch.float32)  # [201, 128]


class StreamingLogMel:
    """Accumulates 16 kHz float samples and the raw log-mel frames that are already final."""

    _filters: torch.Tensor | None = None
    _window: torch.Tensor | None = None

    def __init__(self) -> None:
        self._num_samples = 0
        # Only the samples that frames still to come need: from `_audio_start` on.
        self._audio = np.zeros(0, dtype=np.float32)
        self._audio_start = 0
        self._raw_frames: list[torch.Tensor] = []  # each [128, n] raw log10-mel
        self._num_final_frames = 0

    @classmethod
    def _constants(cls) -> tuple[torch.Tensor, torch.Tensor]:
        if cls._filters is None:
            cls._filters = _whisper_mel_filters()
            cls._window = torch.hann_window(N_FFT)
        return cls._filters, cls._window

    @property
    def num_samples(self) -> int:
        return self._num_samples

    @property
    def num_frames(self) -> int:
        """Frames the whole buffer will have: L // 160."""
        return self._num_samples // HOP

    def append(self, samples: np.ndarray) -> None:
        """Add samples and compute every frame that no later sample can change."""
        if samples.size == 0:
            return
        self._audio = np.concatenate([self._audio, np.asarray(samples, dtype=np.float32)])
        self._num_samples += samples.size
        # Frame i needs samples up to 160 i + 200 (exclusive); the reflected start needs 201.
        final = min(self.num_frames, max(0, (self._num_samples - HALF_WINDOW) // HOP + 1))
        if self._num_samples <= HALF_WINDOW:
            final = 0
        self._compute_frames(final)

    def _compute_frames(self, upto: int, at_end: bool = False) -> None:
        start = self._num_final_frames
        if upto <= start:
            return
        audio = torch.from_numpy(self._audio)
        lo = start * HOP - HALF_WINDOW
        hi = (upto - 1) * HOP + HALF_WINDOW
        left = max(0, -lo)
        if left and not at_end:  # frame 0 reflects x[1:201]: sample 200 belongs to its segment
            hi = max(hi, HALF_WINDOW + 1)
        right = max(0, hi - self._num_samples) if at_end else 0
        segment = audio[max(0, lo) - self._audio_start: min(hi, self._num_samples) - self._audio_start]
        if left or right:  # reflect exactly as torch.stft(center=True) does at the edges
            segment = torch.nn.functional.pad(segment[None, None], (left, right), mode="reflect")[0, 0]
        filters, window = self._constants()
        stft = torch.stft(segment, N_FFT, HOP, window=window, center=False, return_complex=True)
        power = (stft.abs() ** 2).contiguous()
        mel = filters.T @ power
        self._raw_frames.append(torch.clamp(mel, min=1e-10).log10())
        self._num_final_frames = upto
        keep_from = max(0, upto * HOP - HALF_WINDOW)  # the next frame's first sample
        self._audio = self._audio[keep_from - self._audio_start:]
        self._audio_start = keep_from

    def finish(self) -> None:
        """Compute the tail frames, which reach past the end (reflect padding)."""
        if self._num_samples <= HALF_WINDOW:
            raise ValueError(f"audio too short for features: {self._num_samples} samples "
                             f"(need more than {HALF_WINDOW})")
        self._compute_frames(self.num_frames, at_end=True)

    def features(self) -> torch.Tensor:
        """Normalised [128, frames] features of everything appended; call finish() first."""
        if self._num_final_frames != self.num_frames:
            raise RuntimeError("features() before finish(): the tail frames are not computed")
        if len(self._raw_frames) > 1:  # keep one tensor, not one per append
            self._raw_frames = [torch.cat(self._raw_frames, dim=1)]
        raw = self._raw_frames[0]
        raw = torch.maximum(raw, raw.max() - 8.0)
        return (raw + 4.0) / 4.0


def log_mel_features(samples: np.ndarray) -> torch.Tensor:
    """One-shot features of a whole clip through the same code path as streaming."""
    mel = StreamingLogMel()
    mel.append(samples)
    mel.finish()
    return mel.features()
