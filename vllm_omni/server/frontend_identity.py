"""Who this API frontend is, when the server runs several (`--api-server-count N`,
server/frontends.py): its index, the private address its peers relay resumes to, and the
directory of which frontend owns each duplex session. Every response says which frontend
served it (the `x-vllm-omni-frontend` header), for load balancers and for debugging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

FRONTEND_HEADER = b"x-vllm-omni-frontend"


class SessionDirectory(Protocol):
    def claim(self, session_id: str, address: str) -> None:
        """The session is served by the frontend at `address`."""

    def release(self, session_id: str) -> None: ...

    async def owner(self, session_id: str) -> str | None:
        """The address of the frontend serving the session, if any does."""


@dataclass(frozen=True)
class FrontendIdentity:
    index: int
    address: str  # "host:port" of this frontend's private listener
    directory: SessionDirectory


class FrontendHeader:
    """ASGI middleware: the frontend's index on every HTTP response and WebSocket accept."""

    def __init__(self, app: ASGIApp, index: int):
        self.app, self.value = app, str(index).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_header(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message = {**message, "headers": [*message.get("headers", []), (FRONTEND_HEADER, self.value)]}
            await send(message)

        await self.app(scope, receive, send_with_header if scope["type"] in ("http", "websocket") else send)
