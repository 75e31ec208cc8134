"""Silero VAD v6 (ONNX through onnxruntime) and the streaming endpointing detector.

Model resolution (no network access, ever): an explicitly configured file; else the
pinned artifact if it is already in the local Hugging Face cache; else the ONNX file the
`silero-vad` package ships. Every candidate must match the pinned SHA-256.

One `InferenceSession` (one thread) serves every stream; each stream passes its own
recurrent state and 64-sample context in and out, so sessions never share state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vllm_omni.audio.model_files import ModelFileUnavailableError, SharedOnnxModel, checked, configured, packaged
from vllm_omni.audio.pcm import MODEL_RATE

logger = logging.getLogger(__name__)

SILERO_REPO_ID = "istupakov/silero-vad-onnx"
SILERO_FILENAME = "silero_vad.onnx"
SILERO_REVISION = "8b14476858ef240c50b3884bb38cc67290c1cc70"
SILERO_SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"
MIN_THRESHOLD = 0.15
FRAME = 512  # samples at 16 kHz = 32 ms
CONTEXT = 64


class ServerVADUnavailableError(ModelFileUnavailableError):
    pass


def resolve_silero_model(configured_path: str | None = None) -> Path:
    what = "Silero VAD"
    try:
        if configured_path:
            return configured(configured_path, SILERO_SHA256, what)
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(SILERO_REPO_ID, SILERO_FILENAME, revision=SILERO_REVISION)
        except Exception:  # an unusable cache is not an error: fall through to the package
            logger.debug("no Silero VAD in the Hugging Face cache", exc_info=True)
            cached = None
        if isinstance(cached, str) and Path(cached).is_file():
            return checked(Path(cached), SILERO_SHA256, what)
        shipped = packaged("silero-vad", f"silero_vad/data/{SILERO_FILENAME}")
        if shipped is not None:
            return checked(shipped, SILERO_SHA256, what)
    except ModelFileUnavailableError as exc:
        raise ServerVADUnavailableError(str(exc)) from None
    raise ServerVADUnavailableError(
        "server_vad needs a local Silero ONNX artifact (session_defaults.server_vad_model_path, the Hugging "
        "Face cache, or the silero-vad package)")


class SileroModel(SharedOnnxModel):
    """The shared ONNX session; `score` is thread-safe and stateless."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.score(np.zeros((1, CONTEXT + FRAME), np.float32), np.zeros((2, 1, 128), np.float32))  # warm up

    @classmethod
    def resolve(cls, configured_path: str | None) -> Path:
        return resolve_silero_model(configured_path)

    def score(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """Speech probability of one [1, 576] window; returns it and the next state."""
        prob, next_state = self._session.run(
            None, {"input": window, "state": state, "sr": np.array(MODEL_RATE, dtype=np.int64)})
        return float(prob[0, 0]), next_state


@dataclass(frozen=True)
class VadConfig:
    threshold: float = 0.5
    prefix_padding_ms: float = 300
    silence_duration_ms: float = 500
    min_speech_duration_ms: float = 96
    # semantic_vad: a pause in speech is reported (VadResult.pause_sample) for the end-of-turn
    # model to judge when it reaches this length, and again at twice, four times… as long;
    # `silence_duration_ms` still ends the turn without a verdict
    pause_check_ms: float | None = None


@dataclass
class VadResult:
    """What one append did to the detector (times on the session's input timeline)."""

    is_speech: bool = False
    speech_active: bool = False
    started: bool = False
    start_sample: int = 0
    stopped: bool = False
    end_sample: int = 0
    pause_sample: int | None = None  # the last pause check reached in this append
    max_probability: float = 0.0

    @property
    def should_commit(self) -> bool:
        return self.stopped and not self.speech_active


def samples_to_ms(samples: int) -> int:
    return round(samples * 1000 / MODEL_RATE)


class VadDetector:
    """Streaming endpointing (docs/realtime-api.md §7.2) over 16 kHz float32 input."""

    def __init__(self, model: SileroModel, config: VadConfig, start_sample: int = 0):
        self.model, self.config = model, config
        self._min_speech = max(1, round(max(32.0, config.min_speech_duration_ms) * 16))
        self._min_silence = max(1, round(config.silence_duration_ms * 16))
        self._pause_check = None if config.pause_check_ms is None else max(1, round(config.pause_check_ms * 16))
        self._negative = max(config.threshold - 0.15, 0.01)
        self.processed = start_sample
        self._pending = np.zeros(0, np.float32)
        self.reset()

    def reset(self) -> None:
        """Forget speech state and pending samples; the clock keeps counting."""
        self.processed += self._pending.size  # dropped samples still happened on the timeline
        self._pending = np.zeros(0, np.float32)
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(CONTEXT, np.float32)
        self._candidate = 0
        self._candidate_start = 0
        self._end_pause()
        self.in_speech = False
        self.reset_sample = self.processed

    def _end_pause(self) -> None:
        self._silence = 0
        self._silence_start: int | None = None  # where the current pause in speech began
        self._next_check = self._pause_check

    def pause_is_current(self, pause_sample: int) -> bool:
        """Whether the pause reported at `pause_sample` still goes on (no speech since)."""
        return self.in_speech and self._silence_start is not None and self._silence_start < pause_sample

    def feed(self, samples: np.ndarray) -> VadResult:
        result = VadResult(is_speech=self.in_speech)
        data = np.concatenate([self._pending, samples.astype(np.float32, copy=False)])
        frames = data.size // FRAME
        self._pending = data[frames * FRAME:]
        padding = round(self.config.prefix_padding_ms * 16)
        for i in range(frames):
            frame = data[i * FRAME:(i + 1) * FRAME]
            window = np.concatenate([self._context, frame])[None]
            self._context = frame[-CONTEXT:]
            score, self._state = self.model.score(window, self._state)
            p = min(max(score, 0.0), 1.0)
            result.max_probability = max(result.max_probability, p)
            frame_start = self.processed
            self.processed += FRAME
            if not self.in_speech:
                if p >= self.config.threshold:
                    if self._candidate == 0:
                        self._candidate_start = frame_start
                    self._candidate += FRAME
                    if self._candidate >= self._min_speech:
                        self.in_speech = True
                        self._end_pause()
                        result.started = True
                        result.start_sample = max(self.reset_sample, self._candidate_start - padding, 0)
                else:
                    self._candidate = 0
            elif p >= self.config.threshold:
                self._end_pause()
            elif not (p >= self._negative and self._silence == 0):
                if self._silence == 0:
                    self._silence_start = frame_start
                self._silence += FRAME
                if self._next_check is not None and self._silence >= self._next_check:
                    result.pause_sample = self.processed
                    self._next_check *= 2
                if p < self._negative and self._silence >= self._min_silence:
                    self._end_pause()
                    self.in_speech, self._candidate = False, 0
                    result.stopped, result.end_sample = True, self.processed
            result.is_speech = result.is_speech or self.in_speech
        result.speech_active = self.in_speech
        return result
