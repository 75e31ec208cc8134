"""Wire audio formats: names, base64, decoding to 16 kHz float32, encoding model output."""

from __future__ import annotations

import base64
import binascii
import io
import struct
import wave
from dataclasses import dataclass

import numpy as np

from vllm_omni.audio.pcm import float_to_pcm16
from vllm_omni.audio.resample import StreamingResampler

INPUT_SPELLINGS = {
    "pcm16": ("pcm16", "pcm_s16le", "s16le", "pcm", "audio/pcm", "audio/pcm16"),
    "pcm_f32le": ("pcm_f32le", "f32le", "audio/pcm_f32le"),
    "g711_ulaw": ("g711_ulaw", "g711-ulaw", "ulaw", "mulaw", "audio/g711_ulaw", "audio/pcmu"),
    "g711_alaw": ("g711_alaw", "g711-alaw", "alaw", "audio/g711_alaw", "audio/pcma"),
}
OUTPUT_SPELLINGS = {
    "pcm16": ("pcm16", "pcm_s16le", "s16le", "pcm", "audio/pcm"),
    "wav": ("wav", "audio/wav"),
    "g711_ulaw": INPUT_SPELLINGS["g711_ulaw"],
    "g711_alaw": INPUT_SPELLINGS["g711_alaw"],
}
DEFAULT_RATES = {"pcm16": 16000, "pcm_f32le": 16000, "g711_ulaw": 8000, "g711_alaw": 8000, "wav": 24000}
GA_FORMAT_TYPES = {"pcm16": "audio/pcm", "pcm_f32le": "audio/pcm_f32le", "g711_ulaw": "audio/pcmu",
                   "g711_alaw": "audio/pcma", "wav": "audio/wav"}
MIN_RATE, MAX_RATE = 8000, 192000
MODEL_RATE = 16000


class AudioFormatError(ValueError):
    """An unknown or unsupported format name."""


class AudioDataError(ValueError):
    """Audio bytes that cannot be decoded (bad base64, partial samples)."""


def canonical_format(name: str, table: dict[str, tuple[str, ...]] = INPUT_SPELLINGS) -> str:
    lowered = name.strip().lower()
    for canonical, spellings in table.items():
        if lowered in spellings:
            return canonical
    raise AudioFormatError(name)


@dataclass(frozen=True)
class AudioFormat:
    name: str  # canonical
    rate: int

    def ga_object(self) -> dict:
        return {"type": GA_FORMAT_TYPES[self.name], "rate": self.rate}


def check_rate(value: object, param: str = "sample_rate_hz") -> int | None:
    """A rate from the wire: None if absent; ValueError if not an integer in range."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{param} must be an integer")
    if not MIN_RATE <= value <= MAX_RATE:
        raise ValueError(f"{param} must be between {MIN_RATE} and {MAX_RATE}")
    return int(value)


def decode_base64(text: str) -> bytes:
    """Strict standard base64 (alphabet, padding, length a multiple of 4)."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AudioDataError("input audio is not valid base64") from None


def _g711_to_float(data: bytes, law: str) -> np.ndarray:
    values = np.frombuffer(data, dtype=np.uint8).astype(np.int32) ^ (0xFF if law == "ulaw" else 0x55)
    if law == "ulaw":
        exponent, mantissa = (values >> 4) & 0x07, values & 0x0F
        magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
        sign = np.where(values & 0x80, -1, 1)
    else:
        exponent, mantissa = (values >> 4) & 0x07, values & 0x0F
        magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << (exponent - 1))
        sign = np.where(values & 0x80, 1, -1)
    return (sign * magnitude).astype(np.float32) / 32768.0


def _float_to_g711(samples: np.ndarray, law: str) -> bytes:
    pcm = float_to_pcm16(samples).astype(np.int32)
    sign = (pcm < 0).astype(np.int32)
    magnitude = np.abs(pcm)
    if law == "ulaw":
        magnitude = np.minimum(magnitude, 32635) + 0x84
        exponent = np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32) - 7
        exponent = np.clip(exponent, 0, 7)
        mantissa = (magnitude >> (exponent + 3)) & 0x0F
        encoded = ~((sign << 7) | (exponent << 4) | mantissa) & 0xFF
    else:
        magnitude = np.minimum(magnitude, 32767)
        exponent = np.clip(np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32) - 7, 0, 7)
        mantissa = np.where(exponent == 0, magnitude >> 4, magnitude >> (exponent + 3)) & 0x0F
        encoded = (((1 - sign) << 7) | (exponent << 4) | mantissa) ^ 0x55
    return encoded.astype(np.uint8).tobytes()


def bytes_to_float(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """Decode wire bytes of `fmt` to float32 samples at the format's own rate."""
    if fmt.name == "pcm16":
        if len(data) % 2:
            raise AudioDataError("pcm16 audio could not be decoded: odd number of bytes")
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    if fmt.name == "pcm_f32le":
        if len(data) % 4:
            raise AudioDataError("pcm_f32le audio length must be a multiple of 4 bytes")
        samples = np.frombuffer(data, dtype="<f4").astype(np.float32)
        if not np.isfinite(samples).all():
            raise AudioDataError("pcm_f32le audio contains NaN or infinite samples")
        return np.clip(samples, -1.0, 1.0)  # louder than full scale is clipped, as a DAC would
    return _g711_to_float(data, "ulaw" if fmt.name == "g711_ulaw" else "alaw")


class InputConverter:
    """Per-session conversion of appended audio to 16 kHz float32, resampling with state."""

    def __init__(self) -> None:
        self._rate: int | None = None  # the session's input rate, fixed by its first audio
        self._resampler: StreamingResampler | None = None

    def convert(self, data: bytes, fmt: AudioFormat) -> np.ndarray:
        samples = bytes_to_float(data, fmt)
        if self._rate is not None and fmt.rate != self._rate:  # the resampler's state would not carry over
            raise AudioFormatError(f"input rate changed from {self._rate} to {fmt.rate} within the session")
        self._rate = fmt.rate
        if fmt.rate == MODEL_RATE:
            return samples
        if self._resampler is None:
            self._resampler = StreamingResampler(fmt.rate, MODEL_RATE)
        return self._resampler.process(samples)


def encode_output(samples_pcm16: bytes, source_rate: int, fmt: AudioFormat) -> tuple[bytes, int]:
    """Model PCM16 (at `source_rate`) in the requested output format; returns bytes and rate."""
    if fmt.name == "pcm16":
        return samples_pcm16, source_rate
    if fmt.name == "wav":
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(source_rate)
            out.writeframes(samples_pcm16)
        return buffer.getvalue(), source_rate
    floats = np.frombuffer(samples_pcm16, dtype="<i2").astype(np.float32) / 32768.0
    resampled = StreamingResampler(source_rate, fmt.rate).process(floats) if fmt.rate != source_rate else floats
    return _float_to_g711(resampled, "ulaw" if fmt.name == "g711_ulaw" else "alaw"), fmt.rate


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV file as mono float32 samples (channels averaged) and its rate."""
    try:
        with wave.open(io.BytesIO(data)) as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError, struct.error) as exc:
        raise AudioDataError(f"not a WAV file ({exc})") from None
    if width != 2:
        raise AudioDataError(f"WAV audio must be 16-bit PCM, got {8 * width}-bit samples")
    try:
        check_rate(rate, "the WAV's sample rate")
    except ValueError as exc:
        raise AudioDataError(str(exc)) from None
    samples = np.frombuffer(frames[:len(frames) - len(frames) % (2 * channels)], dtype="<i2")
    return samples.reshape(-1, channels).mean(axis=1).astype(np.float32) / 32768.0, rate


def to_model_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    """Samples at `rate` resampled to the rate the models hear."""
    return samples if rate == MODEL_RATE else StreamingResampler(rate, MODEL_RATE).process(samples)
