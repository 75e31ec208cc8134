"""PCM16 <-> float32 conversion and validation of model-rate audio."""

from __future__ import annotations

import numpy as np

MODEL_INPUT_RATE = 16000  # what the audio encoders hear
PCM16_MAX = 32767


def float_to_pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] to int16, rounding to nearest and clipping."""
    scaled = np.rint(np.asarray(samples, dtype=np.float64) * PCM16_MAX)
    return np.clip(scaled, -PCM16_MAX - 1, PCM16_MAX).astype(np.int16)


def pcm16_to_float(pcm: bytes | np.ndarray) -> np.ndarray:
    """Little-endian int16 PCM to float32 in [-1, 1)."""
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        if len(pcm) % 2:
            raise ValueError(f"PCM16 data must have an even number of bytes, got {len(pcm)}")
        pcm = np.frombuffer(pcm, dtype="<i2")
    return np.asarray(pcm, dtype=np.float32) / 32768.0


def validate_model_audio(samples: object, sample_rate: int, what: str = "audio") -> np.ndarray:
    """Check that `samples` is mono float audio at the model rate; return it as float32."""
    if sample_rate != MODEL_INPUT_RATE:
        raise ValueError(f"{what}: sample rate must be {MODEL_INPUT_RATE} Hz, got {sample_rate}")
    if not isinstance(samples, np.ndarray):
        raise ValueError(f"{what}: expected a numpy array of float samples, got {type(samples).__name__}")
    if samples.dtype.kind != "f":
        raise ValueError(f"{what}: expected float samples in [-1, 1], got dtype {samples.dtype}")
    if samples.ndim != 1:
        raise ValueError(f"{what}: expected mono (1-D) samples, got shape {samples.shape}")
    if samples.size == 0:
        raise ValueError(f"{what}: is empty")
    if not np.isfinite(samples).all():
        raise ValueError(f"{what}: contains NaN or infinite samples")
    return samples.astype(np.float32, copy=False)
