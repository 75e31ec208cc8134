"""MiniCPM-o's streaming log-mel front end on the unit grid (docs/minicpmo.md, "Audio units").

Input is 16 kHz audio as it arrives; output is one mel chunk per closed unit. Unit k's core
is input second k (frames [100k, 100k + 100) at 100 frames/s); it closes once 1030 + 1000k ms
have arrived, the 30 ms beyond the second being the right-hand context its last frames'
windows need. Each chunk carries 2 redundancy frames on each side for the encoder's
convolutions (unit 0 none on the left): 102 frames for unit 0, 104 after.

Frames are Whisper's (80 log10 mel bins, 400-sample Hann window centred on every 160th
sample, reflect-padded at the start), computed once, when every sample of their window has
arrived. A unit's chunk is what a whole-buffer extraction of the audio heard when it closed
gives (the reference's "exact" mode, which extracts at every unit): its floor is -10 while
less than 5 s had arrived, then the loudest value of the retained 30 s (and of that
extraction's unfinished tail) minus 8; values are then scaled by (x + 4) / 4. So the chunks
do not depend on how the audio was split into appends. Retention drops the oldest 10 s once
30 s is held.
"""

from __future__ import annotations

import numpy as np
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import spectrogram, window_function

from vllm_omni.audio.pcm import MODEL_RATE

HOP = 160
N_FFT = 400
HALF_WINDOW = N_FFT // 2
MEL_BINS = 80
FRAMES_PER_UNIT = 100
REDUNDANT_FRAMES = 2
FIRST_UNIT_SAMPLES = 16480  # 1030 ms: unit 0's last redundancy frame is then stable
UNIT_SAMPLES = MODEL_RATE  # one second
FIXED_FLOOR, FIXED_FLOOR_UNTIL_S = -10.0, 5.0
DYNAMIC_RANGE = 8.0
RETAINED_FRAMES, DROPPED_FRAMES = 3000, 1000  # 30 s held, 10 s dropped at a time


def unit_close_samples(unit: int) -> int:
    """Input samples after which `unit` closes."""
    return FIRST_UNIT_SAMPLES + UNIT_SAMPLES * unit


class StreamingMel:
    def __init__(self) -> None:
        extractor = WhisperFeatureExtractor(feature_size=MEL_BINS, sampling_rate=MODEL_RATE, hop_length=HOP,
                                            n_fft=N_FFT)
        self._filters = extractor.mel_filters
        self._window = window_function(N_FFT, "hann")
        self._samples = np.zeros(0, dtype=np.float32)  # from absolute sample `_samples_start` on
        self._samples_start = 0
        self._received = 0
        self._raw = np.zeros((MEL_BINS, 0), dtype=np.float32)  # unscaled frames from `_raw_start` on
        self._raw_start = 0
        self.next_unit = 0

    @property
    def received(self) -> int:
        """Samples appended so far."""
        return self._received

    def append(self, samples: np.ndarray) -> list[np.ndarray]:
        """Mel chunks ([80, frames] float32) of the units these samples close, in order."""
        self._samples = np.concatenate([self._samples, np.asarray(samples, dtype=np.float32).reshape(-1)])
        self._received += samples.size
        chunks = []
        while self._received >= unit_close_samples(self.next_unit):
            chunks.append(self._unit_chunk(self.next_unit))
            self.next_unit += 1
        return chunks

    def _unit_chunk(self, unit: int) -> np.ndarray:
        first = FRAMES_PER_UNIT * unit - (REDUNDANT_FRAMES if unit else 0)
        end = FRAMES_PER_UNIT * (unit + 1) + REDUNDANT_FRAMES
        self._compute_frames_until(end)
        raw = self._raw[:, first - self._raw_start:end - self._raw_start]
        chunk = (np.maximum(raw, self._floor(unit_close_samples(unit))) + 4.0) / 4.0
        self._retain()
        return chunk.astype(np.float32)

    def _compute_frames_until(self, end: int) -> None:
        start = self._raw_start + self._raw.shape[1]
        if end > start:
            self._raw = np.concatenate([self._raw, self._frames(start, end)], axis=1)

    def _frames(self, start: int, end: int) -> np.ndarray:
        """Raw log10 mel frames [start, end): frame i's window is samples [160i - 200, 160i + 200)."""
        lo, hi = HOP * start - HALF_WINDOW, HOP * (end - 1) + HALF_WINDOW
        if lo < 0:  # the first frames' windows reach before the audio: reflect it, as Whisper does
            head = self._samples[: hi - self._samples_start]
            signal = np.pad(head, (-lo, 0), mode="reflect")
        else:
            signal = self._samples[lo - self._samples_start: hi - self._samples_start]
        return spectrogram(signal, self._window, frame_length=N_FFT, hop_length=HOP, power=2.0, center=False,
                           mel_filters=self._filters, log_mel="log10").astype(np.float32)

    def _floor(self, heard: int) -> float:
        """The floor for a unit closed once `heard` samples had arrived."""
        if heard < FIXED_FLOOR_UNTIL_S * MODEL_RATE:
            return FIXED_FLOOR
        return max(float(self._raw.max()), float(self._tail(heard).max())) - DYNAMIC_RANGE

    def _tail(self, heard: int) -> np.ndarray:
        """The frames a whole-buffer extraction of the first `heard` samples would add beyond the
        computed ones (their windows reflect-padded at its end; Whisper drops the last frame)."""
        stable_end = self._raw_start + self._raw.shape[1]
        last = heard // HOP  # frames [stable_end, last) of that extraction
        if last <= stable_end:
            return np.full((MEL_BINS, 1), -np.inf, dtype=np.float32)
        lo = HOP * stable_end - HALF_WINDOW
        signal = np.pad(self._samples[lo - self._samples_start: heard - self._samples_start], (0, HALF_WINDOW),
                        mode="reflect")
        frames = spectrogram(signal, self._window, frame_length=N_FFT, hop_length=HOP, power=2.0, center=False,
                             mel_filters=self._filters, log_mel="log10")
        return frames[:, : last - stable_end]

    def _retain(self) -> None:
        """Hold at most 30 s of frames, and only the samples later windows need."""
        if self._raw.shape[1] > RETAINED_FRAMES:
            self._raw = self._raw[:, DROPPED_FRAMES:]
            self._raw_start += DROPPED_FRAMES
        keep_from = max(0, HOP * (self._raw_start + self._raw.shape[1]) - HALF_WINDOW)
        if keep_from > self._samples_start:
            self._samples = self._samples[keep_from - self._samples_start:]
            self._samples_start = keep_from
