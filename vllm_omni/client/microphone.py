"""A live microphone for a realtime connection: from the moment it is switched on it sends
audio in real time without a break, speech when some was queued and silence otherwise, as a
duplex client does (it keeps listening while the answer plays, docs/realtime-api.md §13)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from typing import Any

from vllm_omni.client.connection import RealtimeConnection
from vllm_omni.client.streaming import BYTES_PER_MS, append_events


class Microphone:
    """`async with Microphone(conn) as mic: mic.say(pcm)`: 16 kHz PCM16 in appends of
    `chunk_ms`, paced by the connection's real-time streaming."""

    def __init__(self, conn: RealtimeConnection, chunk_ms: int = 100):
        self.conn, self.chunk_ms = conn, chunk_ms
        self._silence = append_events(b"\0" * (chunk_ms * BYTES_PER_MS), chunk_ms=chunk_ms)[0]
        self._speech: deque[dict[str, Any]] = deque()
        self._task: asyncio.Task[None] | None = None

    def _feed(self) -> Iterator[dict[str, Any]]:
        while True:
            yield self._speech.popleft() if self._speech else self._silence

    def say(self, pcm: bytes, *, cut_in: bool = False) -> None:
        """Queue speech after whatever is still being said or, `cut_in`, instead of it (the
        user breaks off and says this)."""
        if cut_in:
            self._speech.clear()
        self._speech.extend(append_events(pcm, chunk_ms=self.chunk_ms))

    async def __aenter__(self) -> Microphone:
        self._task = asyncio.get_running_loop().create_task(self.conn.stream(self._feed()))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
