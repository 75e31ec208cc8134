"""Requests for /v1/chat/completions as the official `openai` SDK sends them, and what to
check in their answers."""

from __future__ import annotations

import base64
import io
import time
import wave
from collections.abc import Callable

import openai

from tests.realtime_helpers import MODEL_NAME, fixture_pcm
from vllm_omni.client.wav import wav_bytes

SPOKEN = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}
STREAMED = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}, "stream": True}


def sdk(url: str, api_key: str = "none", **options) -> openai.OpenAI:
    """The official client of the server at ws `url`."""
    return openai.OpenAI(base_url=url.replace("ws://", "http://") + "/v1", api_key=api_key, **options)


def http_base(url: str) -> str:
    return url.replace("ws://", "http://")


def wav_b64(pcm16: bytes) -> str:
    """16 kHz PCM16 as a base64 WAV file."""
    return base64.b64encode(wav_bytes(pcm16)).decode()


def spoken_question(name: str = "speech_en_single.wav") -> dict:
    return {"role": "user", "content": [{"type": "input_audio",
                                         "input_audio": {"data": wav_b64(fixture_pcm(name)), "format": "wav"}}]}


def wav_frames(data_b64: str) -> tuple[bytes, int]:
    """The PCM16 frames and rate of a base64 WAV answer (mono, 16-bit, as the server writes it)."""
    with wave.open(io.BytesIO(base64.b64decode(data_b64))) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        return wav.readframes(wav.getnframes()), wav.getframerate()


def ask(client: openai.OpenAI, messages: list[dict], **fields):
    return client.chat.completions.create(model=MODEL_NAME, messages=messages, **{**SPOKEN, **fields})


def streamed_answer(client: openai.OpenAI, messages: list[dict], **fields) -> dict:
    """The stream's pieces in arrival order: ("transcript" | "audio" | "content" | "tool_call", value)."""
    pieces, finish, usage = [], None, None
    for piece in client.chat.completions.create(model=MODEL_NAME, messages=messages, **{**STREAMED, **fields}):
        usage = piece.usage or usage
        if not piece.choices:
            continue
        choice = piece.choices[0]
        finish = choice.finish_reason or finish
        audio = choice.delta.audio
        if audio is not None and audio.transcript:
            pieces.append(("transcript", audio.transcript))
        if audio is not None and audio.data:
            pieces.append(("audio", base64.b64decode(audio.data)))
        if choice.delta.content:
            pieces.append(("content", choice.delta.content))
        for call in choice.delta.tool_calls or ():
            pieces.append(("tool_call", call))
    return {"pieces": pieces, "finish_reason": finish, "usage": usage,
            "pcm": b"".join(v for k, v in pieces if k == "audio"),
            "transcript": "".join(v for k, v in pieces if k == "transcript")}


def wait_until(condition: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until `condition` held (polled every 20 ms); fails after `timeout_s`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - started
