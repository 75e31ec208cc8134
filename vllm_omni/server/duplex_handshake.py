"""What opens a duplex-lane connection's session (docs/realtime-api.md §13.1): autostart from
`?model=`, else the first client message within CONFIG_TIMEOUT_S, which opens a session or
resumes one (§13.4). A failure here is fatal: the connection sends the error and closes with
`close_code(problem)`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.frames import decode_client_frame
from vllm_omni.protocol.query_flags import query_flag
from vllm_omni.session.resume_journal import resume_error

CONFIG_TIMEOUT_S = 10.0
# Opening failures that only mean "this model needs fields at open": autostart then waits for
# the first message instead (docs/realtime-api.md §13.1).
NEEDS_OPENING_FIELDS = frozenset({"ref_audio_required"})
SERVER_SIDE = frozenset({"internal_error", "engine_error", "realtime_input_failed"})
ENVELOPE_KEYS = ("type", "event_id")

FirstText = Callable[[float], Awaitable[str | None]]  # the first text frame (None: binary) within a timeout


@dataclass(frozen=True)
class Handshake:
    """Open a session with `opening` (then handle `first`, if any), or resume one."""

    opening: dict[str, Any] | None = None
    first: dict[str, Any] | None = None
    resume: ResumeRequest | None = None


@dataclass(frozen=True)
class ResumeRequest:
    session_id: str
    resume_token: str
    last_received_server_event_seq: int


def close_code(problem: ProtocolError) -> int:
    """The close code after a fatal handshake error: the client's fault (1008), ours (1011), or
    no capacity now (1013)."""
    if problem.code == "resource_exhausted":
        return 1013
    return 1011 if problem.code in SERVER_SIDE else 1008


def autostart(query: dict[str, str]) -> Handshake | None:
    """Autostart's opening, if the URL asks for one (a model, autostart not off, no resume)."""
    starts, resumes = query_flag("autostart", query.get("autostart")), query_flag("resume", query.get("resume"))
    model = query.get("model")
    return Handshake(opening={"model": model}) if model and starts is not False and not resumes else None


async def first_message(query: dict[str, str], first_text: FirstText) -> Handshake:
    """The handshake the first client message asks for; raises ProtocolError (or, for a
    malformed `session.resume`, ResumeRefused)."""
    try:
        text = await first_text(CONFIG_TIMEOUT_S)
    except TimeoutError:
        raise ProtocolError("config_timeout", "Timeout waiting for session.update") from None
    if text is None:
        raise ProtocolError("bad_event", "binary frames are not supported")
    first = decode_client_frame(text)
    if first["type"] == "session.resume":
        return Handshake(resume=resume_request(first))
    if first["type"] == "session.update":
        opening = first.get("session")
        if opening is None:  # the top-level flat shape: the event itself is the session object
            opening = {key: value for key, value in first.items() if key not in ENVELOPE_KEYS}
        if not isinstance(opening, dict):
            raise ProtocolError("invalid_session_config", "session must be an object", "session")
        return Handshake(opening=opening)
    return Handshake(opening={"model": query.get("model") or None}, first=first)


def resume_request(raw: dict[str, Any]) -> ResumeRequest:
    session_id, token = raw.get("session_id"), raw.get("resume_token")
    seq = raw.get("last_received_server_event_seq", 0)
    if not isinstance(session_id, str) or not session_id or not isinstance(token, str) or not token:
        raise resume_error("invalid_session_resume", "session.resume needs string session_id and resume_token")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise resume_error("invalid_session_resume",
                           "last_received_server_event_seq must be a non-negative integer")
    return ResumeRequest(session_id, token, seq)


async def wait_for_text(receive: Callable[[], Awaitable[dict[str, Any]]], timeout: float) -> str | None:
    """The next ASGI WebSocket message's text (None: binary); raises TimeoutError, and
    ConnectionError when the client went away."""
    message = await asyncio.wait_for(receive(), timeout)
    if message["type"] == "websocket.disconnect":
        raise ConnectionError("the client closed the connection")
    return message.get("text")

