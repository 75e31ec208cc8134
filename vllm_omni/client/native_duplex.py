"""A natively duplex session as a live caller drives it (docs/realtime-api.md §13.7): the clip
streams in real time (camera frames on the appends that close their units), then a final
commit; every unit the model decides is timed against the moment its audio was complete, and
every response it opened is collected and its playback acknowledged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_omni.client.collector import ResponseRecord, collect
from vllm_omni.client.duplex import DuplexConnection
from vllm_omni.client.session_setup import flat_session_update
from vllm_omni.client.streaming import BYTES_PER_MS, MINICPMO_GRID, UnitGrid, append_events
from vllm_omni.client.timing import summarize
from vllm_omni.protocol.server_event_types import (
    OUTPUT_AUDIO_DELTA,
    OUTPUT_AUDIO_TRANSCRIPT_DELTA,
    OUTPUT_TEXT_DELTA,
    RESPONSE_DONE,
    RESPONSE_LISTEN,
)

UNIT_EVENTS = (RESPONSE_LISTEN, OUTPUT_AUDIO_TRANSCRIPT_DELTA, OUTPUT_TEXT_DELTA)  # one per decided unit


@dataclass
class NativeSessionResult:
    decisions: list[str] = field(default_factory=list)  # per unit of the clip: "listen" or "speak"
    decision_lag_ms: list[float] = field(default_factory=list)  # decision received − the unit's audio sent
    ttfp_ms: list[float] = field(default_factory=list)  # per response: first audio − its first unit's audio sent
    responses: list[ResponseRecord] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    grid: UnitGrid = MINICPMO_GRID  # the session's (its capabilities)

    @property
    def audio(self) -> bytes:
        return b"".join(bytes(r.audio) for r in self.responses)

    @property
    def summary(self) -> dict[str, Any]:
        return {"units": len(self.decisions), "unit_ms": self.grid.period_ms,
                "spoken_units": self.decisions.count("speak"),
                "responses": len(self.responses), "decision_lag_ms": summarize(self.decision_lag_ms),
                "ttfp_ms": summarize(self.ttfp_ms)}


def native_opening(*, model: str | None = None, ref_audio: str | None = None, instructions: str | None = None,
                   own_voice: bool = False, **extra_body: Any) -> dict[str, Any]:
    """The session.update that opens a native session (S0's flat shape): the model streams its
    own decisions (`auto_response`), playback acks decide what enters the history. The session
    speaks in the voice of `ref_audio` (a WAV data URL), or in the model's own voice with
    `own_voice` (Moshi); else it is text only."""
    modalities = ("audio", "text") if ref_audio is not None or own_voice else ("text",)
    extra = {"ref_audio": ref_audio} if ref_audio is not None else {}
    return flat_session_update(model=model, instructions=instructions, modalities=modalities,
                               overlap_policy="listen_only", playback_commit_policy="ack_only",
                               extra_body={"auto_response": True, **extra_body}, **extra)


def clip_units(pcm: bytes, grid: UnitGrid = MINICPMO_GRID) -> int:
    """Units the clip closes on `grid`, its zero-padded residual on the final commit included."""
    return grid.units(len(pcm) // BYTES_PER_MS)


async def run_native_session(url: str, pcm: bytes, *, opening: dict[str, Any],
                             frames: list[list[str]] | None = None, realtime: bool = True, chunk_ms: int = 200,
                             headers: dict[str, str] | None = None, timeout_s: float = 300.0) -> NativeSessionResult:
    """Stream `pcm` (16 kHz PCM16) into a native session opened with `opening`, commit it, and
    wait until every unit of the clip is decided and the last response is done. Units follow
    the grid the session announces; appends are `chunk_ms` long, or one unit where units are
    shorter (a caller's microphone sends at least that often)."""
    conn = await DuplexConnection.start(url, opening=opening, headers=headers)
    grid = UnitGrid.of(conn.capabilities)
    result = NativeSessionResult(grid=grid)
    try:
        first = len(conn.events)
        appends = append_events(pcm, chunk_ms=min(chunk_ms, grid.period_ms), frames=frames, grid=grid)
        await conn.stream(appends, realtime=realtime)
        await conn.commit()
        expected = clip_units(pcm, grid)
        events = await _until_decided(conn, expected, timeout_s)
        closes = [_close_time(conn, grid.boundary_ms(unit)) for unit in range(expected)]
        _time_units(result, events, closes)
        responses = collect(events).responses
        result.responses = [r for r in responses.values() if r.status is not None]
        for record in result.responses:
            if record.audio:
                await conn.ack_playback(record.response_id, record.audio_ms)
        await conn.close_session()
    finally:
        await conn.close()
    result.errors = collect(conn.events[first:]).errors
    return result


async def _until_decided(conn: DuplexConnection, units: int, timeout_s: float) -> list[dict[str, Any]]:
    """Events until `units` units were decided and no response is still open."""
    decided, open_responses, events = 0, set(), []
    while decided < units or open_responses:
        event = await conn.next(timeout_s)
        events.append(event)
        kind = event["type"]
        decided += kind in UNIT_EVENTS
        if kind in (OUTPUT_AUDIO_DELTA, OUTPUT_TEXT_DELTA):
            open_responses.add(event["response_id"])
        elif kind == RESPONSE_DONE:
            open_responses.discard(event["response_id"])
    return events


def _close_time(conn: DuplexConnection, boundary_ms: int) -> float:
    """When the audio that closes a unit at `boundary_ms` was sent (the final commit for the
    residual unit)."""
    sent = conn.sent_at(boundary_ms - 1)  # the append carrying the unit's last millisecond
    return sent if sent is not None else conn.commit_times[-1]


def _time_units(result: NativeSessionResult, events: list[dict[str, Any]], closes: list[float]) -> None:
    unit, opened_at_unit = 0, {}
    for event in events:
        if event["type"] == OUTPUT_AUDIO_DELTA and event["response_id"] not in opened_at_unit:
            opened_at_unit[event["response_id"]] = unit
            if unit < len(closes):
                result.ttfp_ms.append((event["_t"] - closes[unit]) * 1000)
        if event["type"] not in UNIT_EVENTS or unit >= len(closes):
            continue
        result.decisions.append("listen" if event["type"] == RESPONSE_LISTEN else "speak")
        result.decision_lag_ms.append((event["_t"] - closes[unit]) * 1000)
        unit += 1
