"""A voice prompt (`ref_audio`, docs/realtime-api.md §13.7): a WAV file sent as a data URL or as
bare base64, decoded to 16 kHz mono float32."""

from __future__ import annotations

import numpy as np

from vllm_omni.audio.formats import decode_base64
from vllm_omni.audio.pcm import MODEL_RATE, AudioDataError, read_wav, resample

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
        samples, rate = read_wav(data)
    except AudioDataError as exc:
        raise ValueError(f"ref_audio: {exc}") from None
    if samples.size == 0:
        raise ValueError("ref_audio holds no samples")
    if samples.size / rate > MAX_PROMPT_S:
        raise ValueError(f"ref_audio is {samples.size / rate:.1f} s long; at most {MAX_PROMPT_S:.0f} s")
    return resample(samples, rate, MODEL_RATE)
