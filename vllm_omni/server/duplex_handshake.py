"""How a duplex-lane connection gets its session (docs/realtime-api.md §13.1): autostart from
`?model=`, else the first client message within CONFIG_TIMEOUT_S. A failure here is fatal:
the connection sends the error and closes (FATAL_CLOSE_CODES)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.frames import decode_client_frame
from vllm_omni.protocol.query_flags import query_flag
from vllm_omni.session.base import Emit, RealtimeSession
from vllm_omni.session.factory import DuplexRoute

CONFIG_TIMEOUT_S = 10.0
# Opening failures that only mean "this model needs fields at open": autostart then waits for
# the first message instead (docs/realtime-api.md §13.1).
NEEDS_OPENING_FIELDS = frozenset({"ref_audio_required"})
SERVER_SIDE = frozenset({"internal_error", "engine_error", "realtime_input_failed"})
ENVELOPE_KEYS = ("type", "event_id")


def close_code(problem: ProtocolError) -> int:
    """The close code after a fatal handshake error: the client's fault (1008), ours (1011), or
    no capacity now (1013)."""
    if problem.code == "resource_exhausted":
        return 1013
    return 1011 if problem.code in SERVER_SIDE else 1008


async def open_duplex(route: DuplexRoute, query: dict[str, str], model: str, emit: Emit,
                      first_text: Callable[[float], Awaitable[str | None]]
                      ) -> tuple[RealtimeSession, dict[str, Any] | None]:
    """The opened session, and the first client event still to be handled (None when the
    first message was the opening `session.update`). `first_text(timeout)` is the first text
    frame (None for a binary frame); raises ProtocolError for every handshake failure."""
    autostart = query_flag("autostart", query.get("autostart"))
    resume = query_flag("resume", query.get("resume"))
    asked_model = query.get("model")
    if asked_model and autostart is not False and not resume:
        try:
            return route.open({"model": asked_model}, model, emit), None
        except ProtocolError as problem:
            if problem.code not in NEEDS_OPENING_FIELDS:
                raise
    try:
        text = await first_text(CONFIG_TIMEOUT_S)
    except TimeoutError:
        raise ProtocolError("config_timeout", "Timeout waiting for session.update") from None
    if text is None:
        raise ProtocolError("bad_event", "binary frames are not supported")
    first = decode_client_frame(text)
    if first["type"] == "session.resume":
        raise ProtocolError("unsupported_session_resume", "this session kind cannot be resumed yet")
    if first["type"] == "session.update":
        opening = first.get("session")
        if opening is None:  # the top-level flat shape: the event itself is the session object
            opening = {key: value for key, value in first.items() if key not in ENVELOPE_KEYS}
        if not isinstance(opening, dict):
            raise ProtocolError("invalid_session_config", "session must be an object", "session")
        return route.open(opening, model, emit), None
    return route.open({"model": asked_model or None}, model, emit), first


async def wait_for_text(receive: Callable[[], Awaitable[dict[str, Any]]], timeout: float) -> str | None:
    """The next ASGI WebSocket message's text (None: binary); raises TimeoutError, and
    ConnectionError when the client went away."""
    message = await asyncio.wait_for(receive(), timeout)
    if message["type"] == "websocket.disconnect":
        raise ConnectionError("the client closed the connection")
    return message.get("text")
