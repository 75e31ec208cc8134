"""Barge-in on the duplex lane: the user speaks over an answer that is still streaming, and the
server stops it (docs/realtime-api.md §6.3), then answers the interruption.

Reaction time: from the moment the client sent the interrupting speech's onset to the receipt
of the interrupted response's `response.done` (status `cancelled`, after which nothing of it
follows, §6.5). The onset is where the server heard the speech start: the `audio_start_ms`
of its `input_audio_buffer.speech_started`, a position on the session's input timeline that
the connection maps back to the send time of the append that carried it (so the resolution
is one append: the microphone sends 40 ms at a time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm_omni.client.collector import collect
from vllm_omni.client.connection import RealtimeConnection
from vllm_omni.client.microphone import Microphone
from vllm_omni.client.session_setup import ga_session_update
from vllm_omni.client.streaming import without_lead_in
from vllm_omni.client.timing import response_metrics
from vllm_omni.client.turns import SessionResult, TurnResult, open_session, running
from vllm_omni.protocol.server_event_types import OUTPUT_AUDIO_DELTA, RESPONSE_DONE, SPEECH_STARTED

# Server VAD that answers each turn and lets speech interrupt an answer (§2.4, §2.5). Without
# prefix padding, `speech_started.audio_start_ms` is the detected onset itself (§5.2).
BARGE_IN_VAD = {"create_response": True, "interrupt_response": True, "prefix_padding_ms": 0}
CANCELLED = "cancelled"
BARGE_IN_REASON = "turn_detected"  # a cancellation by server-VAD barge-in (§5.7)


def _barged_in(done: dict[str, Any]) -> bool:
    response = done.get("response") or {}
    return response.get("status") == CANCELLED and (response.get("status_details") or {}).get("reason") \
        == BARGE_IN_REASON


def reaction_ms(conn: RealtimeConnection, events: Sequence[dict[str, Any]]) -> float | None:
    """The reaction time of the first barge-in among `events` (received on `conn`), from the
    last speech onset before its `response.done`; None without one."""
    onset = None
    for event in events:
        if event["type"] == SPEECH_STARTED:
            onset = event.get("audio_start_ms")
        elif event["type"] == RESPONSE_DONE and _barged_in(event):
            sent = conn.sent_at(onset) if isinstance(onset, (int, float)) else None
            return None if sent is None else (event["_t"] - sent) * 1000
    return None


async def run_barge_in_session(url: str, question: bytes, interruption: bytes, *, turns: int = 1,
                               model: str | None = None, chunk_ms: int = 40, answer_timeout_s: float = 300.0,
                               headers: dict[str, str] | None = None, transcribe: bool = False,
                               on_turn: Callable[[TurnResult], None] | None = None) -> SessionResult:
    """A duplex session with a live microphone (16 kHz PCM16, real time). Each turn: say
    `question`; once its answer's first audio arrives, say `interruption`. The turn gives two
    results: the interrupted answer (its `barge_in_ms` set; None if it completed before the
    server heard the interruption) and the answer to the interruption, whose playback is
    acknowledged. The interruption's lead-in silence is left out: a user who speaks over an
    answer makes sound at once, and a quiet start would let short answers end first. TTFT/TTFP
    count from `response.created` (server-VAD turns, §12). `on_turn` is called with each
    result once its turn has ended."""
    interruption = without_lead_in(interruption)
    update = ga_session_update(model=model, server_vad=True, vad=BARGE_IN_VAD,
                               transcription={"model": model or "default"} if transcribe else None)
    conn = await open_session(url, update, duplex=True, headers=headers)
    result = SessionResult()
    async with running(conn, result), Microphone(conn, chunk_ms) as microphone:
        for _ in range(turns):
            first = len(conn.events)
            microphone.say(question)
            await conn.until(OUTPUT_AUDIO_DELTA, timeout=answer_timeout_s)  # the answer is playing
            microphone.say(interruption, cut_in=True)  # not after the rest of the question's recording
            await conn.until(RESPONSE_DONE, timeout=answer_timeout_s)  # the interrupted answer
            await conn.until(RESPONSE_DONE, timeout=answer_timeout_s)  # the answer to the interruption
            reaction = reaction_ms(conn, conn.events[first:])
            for record in collect(conn.events[first:]).responses.values():
                interrupted = record.status == CANCELLED
                result.turns.append(TurnResult(record, response_metrics(record.events, None),
                                               reaction if interrupted else None))
                if on_turn is not None:
                    on_turn(result.turns[-1])
                if record.audio and not interrupted:  # a cancelled answer's history is cut already (§13.5)
                    await conn.ack_playback(record.response_id, record.audio_ms)
    return result
