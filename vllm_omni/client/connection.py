"""A small async client for `/v1/realtime`: send events, collect what comes back.

Every wait has a timeout; received events are kept (with their receive time in `_t`) so
callers can check orderings and compute latencies afterwards; the send times of commits
are kept too (`commit_times`), as the origin of a turn's latency, and those of appends
(`sent_marks`), to map a position on the session's input timeline (docs/realtime-api.md
§0.1) back to the moment the client sent it.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from collections.abc import Collection, Iterable
from typing import Any

import websockets

from vllm_omni.client import events
from vllm_omni.client.streaming import chunk_duration_s
from vllm_omni.client.url import with_extensions
from vllm_omni.protocol.server_event_types import SESSION_CLOSED

APPEND = "input_audio_buffer.append"


async def connect(url: str, headers: dict[str, str] | None, open_timeout: float) -> Any:
    return await websockets.connect(url, max_size=None, additional_headers=headers, open_timeout=open_timeout)


class RealtimeConnection:
    """Must be created inside a running event loop: a reader task takes every server event
    off the socket as it arrives and stamps its receive time, even while the caller is busy
    streaming audio."""

    def __init__(self, ws: Any, url: str = "", headers: dict[str, str] | None = None):
        self.url, self.headers = url, headers  # what a reconnect needs
        self.events: list[dict[str, Any]] = []
        self.commit_times: list[float] = []
        self.sent_marks: list[tuple[float, float]] = []  # (timeline ms at the append's end, send time)
        self._attach(ws)

    def _attach(self, ws: Any) -> None:
        """Read from `ws` from now on (a new socket starts with an empty inbox)."""
        self.ws = ws
        self._inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._closed: websockets.exceptions.ConnectionClosed | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                event = json.loads(await self.ws.recv())
                event["_t"] = time.monotonic()
                self._inbox.put_nowait(event)
        except websockets.exceptions.ConnectionClosed as closed:
            self._closed = closed
        finally:
            self._inbox.put_nowait(None)  # end of stream

    @classmethod
    async def open(cls, url: str, headers: dict[str, str] | None = None, open_timeout: float = 30.0,
                   extensions: bool = True) -> RealtimeConnection:
        """`extensions`: ask for the server's extension events and fields (this library reads
        them: playback cursors, cumulative audio durations, `session.closed`); without them
        the session is pure GA."""
        url = with_extensions(url) if extensions else url
        return cls(await connect(url, headers, open_timeout), url, headers)

    async def send(self, payload: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(payload if isinstance(payload, (str, bytes)) else json.dumps(payload))
        if isinstance(payload, dict) and payload.get("type") == APPEND and isinstance(payload.get("audio"), str):
            end_ms = (self.sent_marks[-1][0] if self.sent_marks else 0.0) + chunk_duration_s(payload) * 1000
            self.sent_marks.append((end_ms, time.monotonic()))

    def sent_at(self, position_ms: float) -> float | None:
        """When the append carrying timeline position `position_ms` was sent; None beyond what
        was sent. Assumes the server put every append on the timeline: 16 kHz audio, none
        refused, and on the duplex lane none dropped as silence over an answer (which server
        VAD prevents, docs/realtime-api.md §13.6)."""
        index = bisect.bisect_right([end for end, _ in self.sent_marks], position_ms)
        return self.sent_marks[index][1] if index < len(self.sent_marks) else None

    async def send_all(self, payloads: list[dict[str, Any]], delay: float = 0.0) -> None:
        for payload in payloads:
            await self.send(payload)
            if delay:
                await asyncio.sleep(delay)

    def _accept(self, event: dict[str, Any]) -> bool:
        """Whether to deliver a received event (a subclass drops repeats)."""
        return True

    async def next(self, timeout: float = 60.0) -> dict[str, Any]:
        """The next server event; raises the socket's ConnectionClosed once it has ended."""
        deadline = time.monotonic() + timeout
        while True:
            event = await asyncio.wait_for(self._inbox.get(), max(0.1, deadline - time.monotonic()))
            if event is None:
                self._inbox.put_nowait(None)  # stays ended for later calls
                raise self._closed or websockets.exceptions.ConnectionClosedError(None, None)
            if self._accept(event):
                self.events.append(event)
                return event

    async def until(self, kind: str | Collection[str], timeout: float = 120.0) -> list[dict[str, Any]]:
        """Events up to and including the next one of type `kind` (or of one of the types)."""
        kinds = {kind} if isinstance(kind, str) else set(kind)
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            event = await self.next(max(0.1, deadline - time.monotonic()))
            seen.append(event)
            if event["type"] in kinds:
                return seen

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def stream(self, appends: Iterable[dict[str, Any]], realtime: bool = True) -> None:
        """Send appends back to back, or paced at the audio's own speed (`realtime`)."""
        started = time.monotonic()
        sent_s = 0.0
        for event in appends:
            await self.send(event)
            sent_s += chunk_duration_s(event)
            if realtime:
                await asyncio.sleep(max(0.0, started + sent_s - time.monotonic()))

    async def commit(self) -> None:
        self.commit_times.append(time.monotonic())
        await self.send(events.input_audio_commit())

    async def ack_playback(self, response_id: str, played_ms: int) -> None:
        await self.send(events.playback_ack(response_id, played_ms))

    async def close_session(self, timeout: float = 10.0) -> None:
        """`session.close`, then wait for `session.closed` (and the server's close frame)."""
        await self.send(events.session_close())
        try:
            await self.until(SESSION_CLOSED, timeout=timeout)
        finally:
            await self.close()
