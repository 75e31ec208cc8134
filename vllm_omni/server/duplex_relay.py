"""A `session.resume` that reached a frontend other than the one serving its session
(`--api-server-count N`): this frontend carries the connection to the owner's private
listener and passes every frame both ways until either side closes. The client sees one
connection; the owner sees an ordinary resume (docs/realtime-api.md §13.4)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import websockets
from fastapi import WebSocket

from vllm_omni.server.duplex_handshake import ResumeRequest

OPEN_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RelayEnd:
    """How the owner's side closed: this side closes the same way."""

    code: int
    reason: str


async def relay_resume(client: WebSocket, owner: str, resume: ResumeRequest, api_key: str | None) -> RelayEnd:
    url = f"ws://{owner}{client.url.path}" + (f"?{client.url.query}" if client.url.query else "")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        upstream = await websockets.connect(url, additional_headers=headers, max_size=None,
                                            open_timeout=OPEN_TIMEOUT_S, ping_interval=None)
    except (OSError, asyncio.TimeoutError, websockets.InvalidHandshake) as exc:
        return RelayEnd(1011, f"the session's frontend cannot be reached: {exc}"[:120])
    async with upstream:
        await upstream.send(json.dumps({"type": "session.resume", "session_id": resume.session_id,
                                        "resume_token": resume.resume_token,
                                        "last_received_server_event_seq": resume.last_received_server_event_seq}))
        down = asyncio.ensure_future(_owner_to_client(upstream, client))
        up = asyncio.ensure_future(_client_to_owner(client, upstream))
        await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
        for task in (down, up):
            task.cancel()
        await asyncio.gather(down, up, return_exceptions=True)
    return RelayEnd(upstream.close_code or 1000, upstream.close_reason or "")


async def _owner_to_client(upstream: websockets.ClientConnection, client: WebSocket) -> None:
    async for frame in upstream:
        if isinstance(frame, str):
            await client.send_text(frame)
        else:
            await client.send_bytes(frame)


async def _client_to_owner(client: WebSocket, upstream: websockets.ClientConnection) -> None:
    while True:
        message = await client.receive()
        if message["type"] == "websocket.disconnect":
            return
        await upstream.send(message["text"] if message.get("text") is not None else message["bytes"])
