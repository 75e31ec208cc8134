"""OpenAI's chat completions with audio output, streamed, as a voice client uses them: a
spoken (optionally also written, or shown) question goes up as a WAV `input_audio` part, the
answer's transcript and 24 kHz PCM16 come back in `delta.audio` pieces. Times count from the
request's send time, so they compare with the realtime client's (client/timing.py)."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI

from vllm_omni.client.playback import playback_metrics
from vllm_omni.client.timing import pcm16_ms
from vllm_omni.client.wav import wav_bytes

OUTPUT_RATE = 24000  # OpenAI's streamed pcm16: 24 kHz mono, little-endian
DEFAULT_VOICE = "Ethan"  # Qwen3-Omni's default speaker


@dataclass
class ChatTurn:
    """One streamed answer. `*_ms` count from the request's send time; `messages` is the
    conversation up to and including this answer, the next turn's `history`."""

    model: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    transcript: str = ""
    pcm: bytes = b""
    sample_rate: int = OUTPUT_RATE
    audio_id: str | None = None
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    ttft_ms: float | None = None
    ttfp_ms: float | None = None
    last_audio_ms: float | None = None
    total_ms: float = 0.0
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (receive ms, duration ms) per audio piece

    @property
    def chunk_count(self) -> int:
        return len(self.chunks)

    @property
    def audio_duration_ms(self) -> float:
        return pcm16_ms(len(self.pcm), self.sample_rate)

    @property
    def rtf(self) -> float | None:
        """Generation wall time (request sent → last audio piece) over the audio's duration."""
        if self.last_audio_ms is None or not self.pcm:
            return None
        return self.last_audio_ms / self.audio_duration_ms

    @property
    def metrics(self) -> dict[str, Any]:
        """The per-turn keys of the realtime client's metrics (`response_metrics`), playback included."""
        return {"ttft_ms": self.ttft_ms, "ttfp_ms": self.ttfp_ms, "rtf": self.rtf,
                "audio_duration_ms": self.audio_duration_ms, "chunk_count": self.chunk_count,
                "total_ms": self.total_ms, **playback_metrics(self.chunks, self.ttfp_ms)}

    @property
    def assistant_message(self) -> dict[str, Any]:
        """This answer as history: by its audio id, as OpenAI wants; its transcript if it has none."""
        if self.audio_id is not None:
            return {"role": "assistant", "audio": {"id": self.audio_id}}
        return {"role": "assistant", "content": self.transcript}


def user_message(wav_pcm16: bytes | None = None, text: str | None = None,
                 image_url: str | None = None) -> dict[str, Any]:
    """A user message of an image (a data or http URL), 16 kHz PCM16 speech and text, in that
    order, each only if given."""
    parts: list[dict[str, Any]] = []
    if image_url:
        parts.append({"type": "image_url", "image_url": {"url": image_url}})
    if wav_pcm16:
        parts.append({"type": "input_audio",
                      "input_audio": {"data": base64.b64encode(wav_bytes(wav_pcm16)).decode(), "format": "wav"}})
    if text:
        parts.append({"type": "text", "text": text})
    if not parts:
        raise ValueError("a question needs speech, text or an image")
    return {"role": "user", "content": parts}


def _field(value: Any, name: str) -> Any:
    """`delta.audio`'s field: a typed model in newer SDKs, a plain dict (an extra) in older ones."""
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


async def _collect(stream: AsyncIterator[Any], turn: ChatTurn, t0: float) -> None:
    pcm = bytearray()
    async for chunk in stream:
        ms = (time.monotonic() - t0) * 1000
        if chunk.usage is not None:
            turn.usage = chunk.usage.model_dump(exclude_none=True)
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        turn.finish_reason = choice.finish_reason or turn.finish_reason
        audio = getattr(choice.delta, "audio", None)
        turn.audio_id = _field(audio, "id") or turn.audio_id
        text = _field(audio, "transcript") or choice.delta.content
        if text:
            turn.transcript += text
            turn.ttft_ms = ms if turn.ttft_ms is None else turn.ttft_ms
        data = _field(audio, "data")
        if data:
            piece = base64.b64decode(data)
            pcm += piece
            turn.chunks.append((ms, pcm16_ms(len(piece), turn.sample_rate)))
            turn.ttfp_ms = ms if turn.ttfp_ms is None else turn.ttfp_ms
            turn.last_audio_ms = ms
    turn.pcm = bytes(pcm)
    turn.total_ms = (time.monotonic() - t0) * 1000


async def stream_chat(base_url: str, *, wav_pcm16: bytes | None = None, text: str | None = None,
                      image_url: str | None = None, model: str | None = None, voice: str = DEFAULT_VOICE,
                      api_key: str | None = None, max_tokens: int | None = None,
                      history: Sequence[dict[str, Any]] = (), timeout_s: float = 300.0) -> ChatTurn:
    """One streamed `POST base_url/chat/completions` (`base_url` as `chat_base_url` gives it)
    asking `history` plus the question, answered in text and pcm16 audio. `model` None: the
    server's first one (`GET /v1/models`). No retries: a benchmark must see every failure."""
    messages = [*history, user_message(wav_pcm16, text, image_url)]
    async with AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", max_retries=0, timeout=timeout_s) as client:
        if model is None:
            served = (await client.models.list()).data
            if not served:
                raise ValueError(f"{base_url}/models lists no model")
            model = served[0].id
        limit = {} if max_tokens is None else {"max_completion_tokens": max_tokens}
        turn = ChatTurn(model=model)
        t0 = time.monotonic()
        stream = await client.chat.completions.create(
            model=model, messages=messages, modalities=["text", "audio"], audio={"voice": voice, "format": "pcm16"},
            stream=True, stream_options={"include_usage": True}, **limit)
        await _collect(stream, turn, t0)
    turn.messages = [*messages, turn.assistant_message]
    return turn


async def run_chat(base_url: str, wav_pcm16: bytes, *, turns: int = 1, text: str | None = None,
                   image_url: str | None = None, model: str | None = None, voice: str = DEFAULT_VOICE,
                   api_key: str | None = None, max_tokens: int | None = None,
                   on_turn: Callable[[ChatTurn], None] | None = None) -> list[ChatTurn]:
    """One conversation of `turns` questions, each the same speech (and `text`; the image goes
    with the first only), the earlier questions and answers as history; `on_turn` is called
    with each answer as it ends."""
    answers: list[ChatTurn] = []
    for number in range(turns):
        previous = answers[-1] if answers else None
        answers.append(await stream_chat(
            base_url, wav_pcm16=wav_pcm16, text=text, image_url=None if number else image_url,
            model=previous.model if previous else model, voice=voice, api_key=api_key, max_tokens=max_tokens,
            history=previous.messages if previous else ()))
        if on_turn is not None:
            on_turn(answers[-1])
    return answers
