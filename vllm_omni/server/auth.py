"""API-key checks, done before anything else on a route (before a WebSocket is accepted).

As in vLLM: `Authorization: Bearer <key>` on every `/v1` route. Browsers cannot set
headers on a WebSocket, so the GA convention of offering the subprotocol
`openai-insecure-api-key.<key>` is accepted too. Comparison is constant-time.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

BROWSER_KEY_PREFIX = "openai-insecure-api-key."
# OpenAI's body for a refused key (the official SDK raises AuthenticationError with its message)
UNAUTHORIZED = {"error": {"message": "Incorrect API key provided: send `Authorization: Bearer <key>`.",
                          "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


def offered_keys(headers: Headers) -> list[str]:
    """The keys a request presents: its bearer token and any subprotocol-borne key."""
    header = headers.get("authorization", "")
    keys = [header[7:].strip()] if header.lower().startswith("bearer ") else []
    offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
    keys += [p[len(BROWSER_KEY_PREFIX):] for p in offered if p.startswith(BROWSER_KEY_PREFIX)]
    return keys


def authorized(headers: Headers, api_key: str | None) -> bool:
    """True without a configured key, else when one presented key matches."""
    if not api_key:
        return True
    expected = api_key.encode()
    return any(hmac.compare_digest(key.encode(), expected) for key in offered_keys(headers))


class ApiKeyMiddleware:
    """Every /v1 HTTP route (and /metrics when protected) checks the key before anything else.
    WebSocket routes check it themselves, before accepting. A plain ASGI middleware: it leaves
    streamed responses and their disconnect handling untouched."""

    def __init__(self, app: ASGIApp, api_key: str | None, protect_metrics: bool):
        self.app, self.api_key, self.protect_metrics = app, api_key, protect_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.api_key:
            path = scope["path"]
            protected = path.startswith("/v1") or (self.protect_metrics and path.startswith("/metrics"))
            if protected and not authorized(Headers(scope=scope), self.api_key):
                await JSONResponse(UNAUTHORIZED, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
