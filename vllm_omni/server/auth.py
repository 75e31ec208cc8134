"""API-key checks, done before anything else on a route (before a WebSocket is accepted).

As in vLLM: `Authorization: Bearer <key>` on every `/v1` route. Browsers cannot set
headers on a WebSocket, so the GA convention of offering the subprotocol
`openai-insecure-api-key.<key>` is accepted too. Comparison is constant-time.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers

BROWSER_KEY_PREFIX = "openai-insecure-api-key."
UNAUTHORIZED = {"error": "Unauthorized"}  # vLLM's body for a refused key


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
