"""One realtime conversation driven like a voice client: speak, wait for the answer,
acknowledge its playback, repeat; with the timing of every turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_omni.client.collector import ResponseRecord, collect
from vllm_omni.client.connection import RealtimeConnection
from vllm_omni.client.events import response_create
from vllm_omni.client.session_setup import ga_session_update
from vllm_omni.client.streaming import append_events
from vllm_omni.client.timing import response_metrics, session_summary
from vllm_omni.protocol.server_event_types import RESPONSE_DONE, SESSION_UPDATED

TRAILING_SILENCE_S = 1.5  # server VAD needs silence after the speech to end the turn


@dataclass
class TurnResult:
    response: ResponseRecord | None
    metrics: dict[str, Any]


@dataclass
class SessionResult:
    turns: list[TurnResult] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any]:
        return session_summary([t.metrics for t in self.turns])

    @property
    def audio(self) -> bytes:
        return b"".join(bytes(t.response.audio) for t in self.turns if t.response is not None)

    @property
    def transcripts(self) -> list[str]:
        return [t.response.transcript if t.response is not None else "" for t in self.turns]


async def run_session(url: str, pcm: bytes, *, turns: int = 1, model: str | None = None, server_vad: bool = False,
                      realtime: bool = True, chunk_ms: int = 200, answer_timeout_s: float = 300.0,
                      headers: dict[str, str] | None = None, transcribe: bool = False) -> SessionResult:
    """Speak `pcm` (16 kHz PCM16) `turns` times. Manual turns commit and ask for a response;
    with server VAD the server decides (1.5 s of silence follows the speech). TTFT/TTFP
    count from the commit's send time, or (server VAD) from `response.created`."""
    conn = await RealtimeConnection.open(url, headers=headers)
    result = SessionResult()
    try:
        await conn.next()  # session.created
        await conn.send(ga_session_update(model=model, server_vad=server_vad,
                                          transcription={"model": model or "default"} if transcribe else None))
        await conn.until(SESSION_UPDATED)
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
            if record is not None and record.audio:
                await conn.ack_playback(record.response_id, record.audio_ms)
        await conn.close_session()
    finally:
        await conn.close()
        result.errors = collect(conn.events).errors
    return result
