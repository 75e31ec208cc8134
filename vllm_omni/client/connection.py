"""A small async client for `/v1/realtime`: send events, collect what comes back.

Every wait has a timeout; received events are kept (with their receive time in `_t`) so
callers can check orderings and compute latencies afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import websockets

PCM16_CHUNK_100MS = 3200  # bytes of 16 kHz mono PCM16


def append_events(pcm: bytes, size: int = PCM16_CHUNK_100MS) -> list[dict[str, Any]]:
    """`input_audio_buffer.append` events for 16 kHz PCM16, `size` bytes each."""
    return [{"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i:i + size]).decode()}
            for i in range(0, len(pcm), size)]


class RealtimeConnection:
    def __init__(self, ws: Any):
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, url: str, headers: dict[str, str] | None = None,
                   open_timeout: float = 30.0) -> RealtimeConnection:
        ws = await websockets.connect(url, max_size=None, additional_headers=headers, open_timeout=open_timeout)
        return cls(ws)

    async def send(self, payload: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(payload if isinstance(payload, (str, bytes)) else json.dumps(payload))

    async def send_all(self, payloads: list[dict[str, Any]], delay: float = 0.0) -> None:
        for payload in payloads:
            await self.send(payload)
            if delay:
                await asyncio.sleep(delay)

    async def next(self, timeout: float = 60.0) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        event["_t"] = time.monotonic()
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Events up to and including the next one of type `kind`."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            event = await self.next(max(0.1, deadline - time.monotonic()))
            seen.append(event)
            if event["type"] == kind:
                return seen

    async def close(self) -> None:
        await self.ws.close()
