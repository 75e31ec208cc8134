"""Wire audio formats: names, base64, decoding to the model rate, encoding model output (the
samples themselves, their rates and resampling are audio/pcm.py's)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import numpy as np

from vllm_omni.audio.pcm import (
    MAX_RATE,
    MIN_RATE,
    MODEL_RATE,
    AudioDataError,
    StreamingResampler,
    float_to_pcm16,
    pcm16_to_float,
    resample,
    wav_bytes,
)

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
DEFAULT_RATES = {"pcm16": MODEL_RATE, "pcm_f32le": MODEL_RATE, "g711_ulaw": 8000, "g711_alaw": 8000, "wav": 24000}
GA_FORMAT_TYPES = {"pcm16": "audio/pcm", "pcm_f32le": "audio/pcm_f32le", "g711_ulaw": "audio/pcmu",
                   "g711_alaw": "audio/pcma", "wav": "audio/wav"}


class AudioFormatError(ValueError):
    """An unknown or unsupported format name."""


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
        return pcm16_to_float(data)
    if fmt.name == "pcm_f32le":
        if len(data) % 4:
            raise AudioDataError("pcm_f32le audio length must be a multiple of 4 bytes")
        samples = np.frombuffer(data, dtype="<f4").astype(np.float32)
        if not np.isfinite(samples).all():
            raise AudioDataError("pcm_f32le audio contains NaN or infinite samples")
        return np.clip(samples, -1.0, 1.0)  # louder than full scale is clipped, as a DAC would
    return _g711_to_float(data, "ulaw" if fmt.name == "g711_ulaw" else "alaw")


def decode_to_model_rate(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """A whole clip of wire bytes in `fmt` as float32 samples at the model rate."""
    return resample(bytes_to_float(data, fmt), fmt.rate, MODEL_RATE)


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

    def flush(self) -> np.ndarray:
        """The resampler's held-back last few ms (a commit takes all appended audio); the next
        append starts a fresh stream at the same rate."""
        resampler, self._resampler = self._resampler, None
        return resampler.flush() if resampler is not None else np.zeros(0, dtype=np.float32)


class OutputEncoder:
    """Per-answer encoding of the model's PCM16 chunks in the session's output format, one
    resampler for the whole answer (state carried across chunks; the last chunk flushes it)."""

    def __init__(self, fmt: AudioFormat) -> None:
        self.fmt = fmt
        self._resampler: StreamingResampler | None = None
        self._delivered, self._rate = 0, 0  # samples encoded so far, and their rate

    @property
    def delivered_ms(self) -> int:
        """How much audio the encoded chunks have carried so far."""
        return self._delivered * 1000 // self._rate if self._rate else 0

    def encode(self, samples_pcm16: bytes, source_rate: int, *, final: bool = False) -> tuple[bytes, int]:
        """This chunk in the output format (a G.711 chunk may hold a few ms less or, when
        `final`, more than it was given: the resampler's hold-back); returns bytes and rate."""
        if self.fmt.name in ("pcm16", "wav"):
            self._delivered, self._rate = self._delivered + len(samples_pcm16) // 2, source_rate
            return (samples_pcm16 if self.fmt.name == "pcm16" else wav_bytes(samples_pcm16, source_rate)), source_rate
        samples = pcm16_to_float(samples_pcm16)
        if self.fmt.rate != source_rate:
            if self._resampler is None:
                self._resampler = StreamingResampler(source_rate, self.fmt.rate)
            samples = self._resampler.process(samples)
            if final:
                samples = np.concatenate([samples, self._resampler.flush()])
                self._resampler = None
        self._delivered, self._rate = self._delivered + samples.size, self.fmt.rate
        return _float_to_g711(samples, "ulaw" if self.fmt.name == "g711_ulaw" else "alaw"), self.fmt.rate


def encode_output(samples_pcm16: bytes, source_rate: int, fmt: AudioFormat) -> tuple[bytes, int]:
    """A whole answer's PCM16 (at `source_rate`) in the output format; returns bytes and rate."""
    return OutputEncoder(fmt).encode(samples_pcm16, source_rate, final=True)
