"""A WebSocket proxy on 127.0.0.1 that records every frame between a client and the server.

The frameworks under test talk to the proxy exactly as they would to the server (same path,
query and headers); the proxy forwards each frame unchanged and keeps a parsed copy, with
base64 audio payloads replaced by their decoded length so a record stays small.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

_AUDIO_FIELDS = {"input_audio_buffer.append": "audio", "response.output_audio.delta": "delta",
                 "response.audio.delta": "delta"}
_FORWARDED_HEADERS = ("authorization", "openai-beta", "api-key", "user-agent")


def _b64_len(value: Any) -> int:
    try:
        return len(base64.b64decode(value))
    except (binascii.Error, TypeError, ValueError):
        return -1


@dataclass
class Frame:
    direction: str  # "c2s" (client to server) or "s2c"
    t: float
    event: dict[str, Any] | None  # None for a frame that is not a JSON object
    raw: str | None = None  # the text of a frame that did not parse

    @property
    def type(self) -> str | None:
        return self.event.get("type") if self.event else None


@dataclass
class Connection:
    path: str
    headers: dict[str, str]
    frames: list[Frame] = field(default_factory=list)
    close: tuple[str, int | None, str] | None = None  # who closed, code, reason


def _record(conn: Connection, direction: str, message: str | bytes) -> None:
    if isinstance(message, bytes):
        conn.frames.append(Frame(direction, time.monotonic(), None, raw=f"<binary {len(message)} bytes>"))
        return
    try:
        event = json.loads(message)
    except ValueError:
        conn.frames.append(Frame(direction, time.monotonic(), None, raw=message[:2000]))
        return
    if not isinstance(event, dict):
        conn.frames.append(Frame(direction, time.monotonic(), None, raw=message[:2000]))
        return
    key = _AUDIO_FIELDS.get(event.get("type"))
    if key and isinstance(event.get(key), str):
        event[key] = f"<{_b64_len(event[key])} bytes>"
    conn.frames.append(Frame(direction, time.monotonic(), event))


class RecordingProxy:
    """`async with RecordingProxy("ws://127.0.0.1:PORT") as proxy:` then point clients at proxy.ws_url."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.connections: list[Connection] = []
        self._server = None
        self.port = 0

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> RecordingProxy:
        self._server = await serve(self._handle, "127.0.0.1", 0, max_size=None, ping_interval=None)
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    def frames(self, direction: str | None = None) -> list[Frame]:
        return [f for c in self.connections for f in c.frames if direction in (None, f.direction)]

    def events(self, direction: str, type_: str | None = None) -> list[dict[str, Any]]:
        return [f.event for f in self.frames(direction) if f.event is not None and type_ in (None, f.type)]

    async def _handle(self, downstream: ServerConnection) -> None:
        request = downstream.request
        headers = {k: v for k, v in request.headers.raw_items() if k.lower() in _FORWARDED_HEADERS}
        conn = Connection(request.path, dict(headers))
        self.connections.append(conn)
        try:
            upstream = await connect(self.upstream + request.path, additional_headers=headers, max_size=None,
                                     ping_interval=None, open_timeout=10)
        except Exception as exc:  # refused upstream: refuse downstream the same way
            status = getattr(getattr(exc, "response", None), "status_code", None)
            conn.close = ("upstream-refused", status, repr(exc))
            await downstream.close(1011, f"upstream refused: {status}")
            return

        async def pump(src, dst, direction: str) -> None:
            try:
                async for message in src:
                    _record(conn, direction, message)
                    await dst.send(message)
            except ConnectionClosed:
                pass
            finally:
                if conn.close is None:
                    code = src.close_code
                    conn.close = ("server" if direction == "s2c" else "client", code, src.close_reason or "")
                code = src.close_code if src.close_code not in (None, 1005, 1006, 1015) else 1000
                await dst.close(code, src.close_reason or "")

        async with upstream:
            await asyncio.gather(pump(downstream, upstream, "c2s"), pump(upstream, downstream, "s2c"))
