"""One realtime conversation driven like a voice client: speak, wait for the answer,
acknowledge its playback, repeat; with the timing of every turn. On the GA lane or, with
`duplex`, on the duplex lane (docs/realtime-api.md §13), whose session the first
`session.update` opens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni.client.collector import ResponseRecord, collect
from vllm_omni.client.connection import RealtimeConnection
from vllm_omni.client.duplex import DuplexConnection
from vllm_omni.client.events import image_message, response_create
from vllm_omni.client.images import image_data_url
from vllm_omni.client.session_setup import ga_session_update
from vllm_omni.client.streaming import append_events
from vllm_omni.client.timing import response_metrics, session_summary
from vllm_omni.protocol.server_event_types import ERROR, ITEM_DONE, RESPONSE_DONE, SESSION_UPDATED

TRAILING_SILENCE_S = 1.5  # server VAD needs silence after the speech to end the turn


@dataclass
class TurnResult:
    response: ResponseRecord | None
    metrics: dict[str, Any]
    barge_in_ms: float | None = None  # set on a response the client's speech interrupted (client/barge_in.py)


@dataclass
class SessionResult:
    turns: list[TurnResult] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    image_error: dict[str, Any] | None = None  # the server's refusal of the image, not counted in `errors`

    @property
    def summary(self) -> dict[str, Any]:
        return session_summary([t.metrics for t in self.turns])

    @property
    def audio(self) -> bytes:
        return b"".join(bytes(t.response.audio) for t in self.turns if t.response is not None)

    @property
    def transcripts(self) -> list[str]:
        return [t.response.transcript if t.response is not None else "" for t in self.turns]


@asynccontextmanager
async def running(conn: RealtimeConnection, result: SessionResult) -> AsyncIterator[None]:
    """A session's turns (the body), then `session.close`; however it ends, the socket closes
    and `result` records the session's errors (all but the image's refusal)."""
    try:
        yield
        await conn.close_session()
    finally:
        await conn.close()
        result.errors = [e for e in collect(conn.events).errors if e is not result.image_error]


async def open_session(url: str, update: dict[str, Any], *, duplex: bool = False,
                       headers: dict[str, str] | None = None) -> RealtimeConnection:
    """A configured session: GA, `session.created` then `update`; duplex, `update` opens it."""
    if duplex:
        return await DuplexConnection.start(url, opening=update, headers=headers)
    conn = await RealtimeConnection.open(url, headers=headers)
    try:
        await conn.next()  # session.created
        await conn.send(update)
        await conn.until(SESSION_UPDATED)
    except BaseException:
        await conn.close()
        raise
    return conn


async def show_image(conn: RealtimeConnection, path: str | Path, timeout: float = 60.0) -> dict[str, Any] | None:
    """The image as a user message (docs/realtime-api.md §4.5); the server's `error` if it
    refused it (a model without image input does), else None."""
    await conn.send(image_message(image_data_url(path)))
    reply = (await conn.until((ITEM_DONE, ERROR), timeout=timeout))[-1]
    return reply if reply["type"] == ERROR else None


async def run_session(url: str, pcm: bytes, *, turns: int = 1, model: str | None = None, server_vad: bool = False,
                      realtime: bool = True, chunk_ms: int = 200, answer_timeout_s: float = 300.0,
                      headers: dict[str, str] | None = None, transcribe: bool = False, duplex: bool = False,
                      image: str | Path | None = None,
                      on_turn: Callable[[TurnResult], None] | None = None) -> SessionResult:
    """Speak `pcm` (16 kHz PCM16) `turns` times, after showing `image` if given. Manual turns
    commit and ask for a response; with server VAD the server decides (1.5 s of silence
    follows the speech). TTFT/TTFP count from the commit's send time, or (server VAD) from
    `response.created`. `on_turn` is called with each turn's result as it ends."""
    update = ga_session_update(model=model, server_vad=server_vad,
                               transcription={"model": model or "default"} if transcribe else None)
    conn = await open_session(url, update, duplex=duplex, headers=headers)
    result = SessionResult()
    async with running(conn, result):
        if image is not None:
            result.image_error = await show_image(conn, image)
        audio = pcm + (b"\0\0" * int(16000 * TRAILING_SILENCE_S) if server_vad else b"")
        for _ in range(turns):
            first = len(conn.events)
            await conn.stream(append_events(audio, chunk_ms=chunk_ms), realtime=realtime)
            if not server_vad:
                await conn.commit()
                await conn.send(response_create())
            done = (await conn.until(RESPONSE_DONE, timeout=answer_timeout_s))[-1]
            record = collect(conn.events[first:]).responses.get((done.get("response") or {}).get("id"))
            t0 = None if server_vad else conn.commit_times[-1]  # None: from response.created (docs/realtime-api.md §12)
            result.turns.append(TurnResult(record, response_metrics(record.events if record else [], t0)))
            if on_turn is not None:
                on_turn(result.turns[-1])
            if record is not None and record.audio:
                await conn.ack_playback(record.response_id, record.audio_ms)
    return result
