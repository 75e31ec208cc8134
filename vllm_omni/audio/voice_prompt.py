"""A voice prompt (`ref_audio`, docs/realtime-api.md §13.7): a WAV file sent as a data URL or as
bare base64, decoded to 16 kHz mono float32."""

from __future__ import annotations

import io
import wave

import numpy as np

from vllm_omni.audio.formats import AudioDataError, decode_base64
from vllm_omni.audio.resample import StreamingResampler

MODEL_RATE = 16000
MAX_PROMPT_S = 30.0
DATA_URL_PREFIX = "data:audio/"


def decode_voice_prompt(value: str) -> np.ndarray:
    """The prompt's samples; ValueError naming what is wrong."""
    payload = value
    if value.startswith(DATA_URL_PREFIX):
        header, _, payload = value.partition(",")
        if not header.endswith(";base64"):
            raise ValueError("ref_audio must be a base64 data URL (data:audio/wav;base64,…) or bare base64")
    try:
        data = decode_base64(payload)
    except AudioDataError:
        raise ValueError("ref_audio is not valid base64") from None
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"ref_audio is not an uncompressed PCM WAV file ({exc})") from None
    if width != 2:
        raise ValueError(f"ref_audio has {8 * width}-bit samples; send 16-bit PCM")
    samples = np.frombuffer(frames, "<i2").reshape(-1, channels).mean(axis=1).astype(np.float32) / 32768.0
    if samples.size == 0:
        raise ValueError("ref_audio holds no samples")
    if samples.size / rate > MAX_PROMPT_S:
        raise ValueError(f"ref_audio is {samples.size / rate:.1f} s long; at most {MAX_PROMPT_S:.0f} s")
    if rate != MODEL_RATE:
        samples = StreamingResampler(rate, MODEL_RATE).process(samples)
    return samples
