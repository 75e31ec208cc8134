"""Raw audio, in one place: the rate the models hear, PCM16 <-> float32, WAV files, and
band-limited resampling of whole clips and of streams, chunk by chunk."""

from __future__ import annotations

import io
import struct
import wave
from functools import lru_cache
from math import gcd

import numpy as np
from scipy.signal import firwin, kaiserord, upfirdn

MODEL_RATE = 16000  # what the audio encoders (and Silero, Smart Turn) hear
PCM16_MAX = 32767
MIN_RATE, MAX_RATE = 8000, 192000

# The resampler's low-pass: flat to 90% of the narrower of the two Nyquist bands, at least
# STOPBAND_DB down from that band's edge on (what would alias or image).
PASSBAND = 0.9
STOPBAND_DB = 80.0


class AudioDataError(ValueError):
    """Audio bytes that cannot be decoded (bad base64, partial samples, not a WAV file)."""


def float_to_pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] to int16, rounding to nearest and clipping."""
    scaled = np.rint(np.asarray(samples, dtype=np.float64) * PCM16_MAX)
    return np.clip(scaled, -PCM16_MAX - 1, PCM16_MAX).astype(np.int16)


def float_to_pcm16_bytes(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as little-endian PCM16 bytes."""
    return float_to_pcm16(samples).astype("<i2").tobytes()


def pcm16_to_float(pcm: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """Little-endian int16 PCM to float32 in [-1, 1); AudioDataError on a partial sample."""
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        if len(pcm) % 2:
            raise AudioDataError(f"PCM16 data must have an even number of bytes, got {len(pcm)}")
        pcm = np.frombuffer(pcm, dtype="<i2")
    return np.asarray(pcm, dtype=np.float32) / 32768.0


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV file's bytes as mono float32 samples (channels averaged) and its rate;
    AudioDataError naming what is wrong."""
    try:
        with wave.open(io.BytesIO(data)) as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError, struct.error) as exc:
        raise AudioDataError(f"not an uncompressed PCM WAV file ({exc})") from None
    if width != 2:
        raise AudioDataError(f"WAV audio must be 16-bit PCM, got {8 * width}-bit samples")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioDataError(f"the WAV's sample rate must be between {MIN_RATE} and {MAX_RATE}, got {rate}")
    samples = np.frombuffer(frames[:len(frames) - len(frames) % (2 * channels)], dtype="<i2")
    return samples.reshape(-1, channels).mean(axis=1).astype(np.float32) / 32768.0, rate


def wav_bytes(pcm16: bytes, sample_rate: int) -> bytes:
    """Mono PCM16 as the bytes of a WAV file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm16)
    return buffer.getvalue()


@lru_cache(maxsize=16)
def _lowpass(up: int, down: int) -> tuple[np.ndarray, int]:
    """The resampler's FIR at the upsampled rate (gain `up`, for the zeros upsampling puts
    between samples) and its delay in output samples: the tap count is 2 * down * delay + 1,
    so the delay is a whole number of output samples and can be taken back out."""
    band = 1.0 / max(up, down)  # the narrower Nyquist band, as a fraction of the upsampled one
    numtaps, beta = kaiserord(STOPBAND_DB, (1 - PASSBAND) * band)
    delay = -(-(numtaps - 1) // (2 * down))
    taps = firwin(2 * down * delay + 1, (1 + PASSBAND) / 2 * band, window=("kaiser", beta))
    return taps * up, delay


class StreamingResampler:
    """Band-limited polyphase resampling of a stream, chunk by chunk (scipy's `upfirdn` over the
    input since the oldest sample a pending output needs). Each output sample is the same dot
    product however the input was chunked, so chunked output equals whole-stream output
    bit for bit. Outputs are aligned with the input (the filter's delay is taken back out),
    which holds back the filter's last `delay` output samples (about 3 ms) until more input
    comes or `flush()` ends the stream; in all, N input samples give ceil(N * target / source)."""

    def __init__(self, source_rate: int, target_rate: int):
        divisor = gcd(source_rate, target_rate)
        self.source_rate, self.target_rate = source_rate, target_rate
        self.up, self.down = target_rate // divisor, source_rate // divisor
        self._taps, self._delay = _lowpass(self.up, self.down)
        self._kept = np.zeros(0, dtype=np.float64)  # input from index self._kept_from on
        self._kept_from = 0  # a multiple of `down`, so filtered outputs line up with whole indices
        self._received = 0
        self._next = 0  # the next output sample's index
        self._flushed = False

    @property
    def delay(self) -> int:
        """Output samples held back at any time (the filter's delay)."""
        return self._delay

    def process(self, samples: np.ndarray) -> np.ndarray:
        """This chunk's share of the output: float32, possibly empty."""
        if self._flushed:
            raise RuntimeError("the stream was flushed; start a new StreamingResampler")
        chunk = np.asarray(samples, dtype=np.float64).reshape(-1)
        self._received += chunk.size
        self._kept = np.concatenate([self._kept, chunk])
        # Filtered sample m needs upsampled input up to index m * down; output n is filtered n + delay.
        return self._emit((self.up * self._received - 1) // self.down - self._delay)

    def flush(self) -> np.ndarray:
        """The held-back tail (the input continued by silence); the stream then ends."""
        total = -(-self._received * self.up // self.down)
        needed = -(-((total - 1 + self._delay) * self.down + 1) // self.up) - self._received
        if needed > 0:
            self._kept = np.concatenate([self._kept, np.zeros(needed)])
        out = self._emit(total - 1)
        self._flushed = True
        return out

    def _emit(self, last: int) -> np.ndarray:
        if last < self._next:
            return np.zeros(0, dtype=np.float32)
        filtered = upfirdn(self._taps, self._kept, self.up, self.down)
        first_filtered = self.up * self._kept_from // self.down
        out = filtered[self._next + self._delay - first_filtered:last + self._delay - first_filtered + 1]
        self._next = last + 1
        # Keep the input that output self._next onward still needs.
        oldest = max(0, ((self._next + self._delay) * self.down - self._taps.size + 1) // self.up)
        oldest -= oldest % self.down
        if oldest > self._kept_from:
            self._kept = self._kept[oldest - self._kept_from:]
            self._kept_from = oldest
        return out.astype(np.float32)


def resample(samples: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    """A whole clip resampled: the same samples as streaming it through StreamingResampler."""
    if source_rate == target_rate:
        return np.asarray(samples, dtype=np.float32)
    resampler = StreamingResampler(source_rate, target_rate)
    return np.concatenate([resampler.process(samples), resampler.flush()])


def validate_model_audio(samples: object, sample_rate: int, what: str = "audio") -> np.ndarray:
    """Check that `samples` is mono float audio at the model rate; return it as float32."""
    if sample_rate != MODEL_RATE:
        raise ValueError(f"{what}: sample rate must be {MODEL_RATE} Hz, got {sample_rate}")
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
