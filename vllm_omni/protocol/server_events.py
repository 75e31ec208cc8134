"""Server events (docs/realtime-api.md §5): the generic wire shape and the shared pieces.

GA-lane events get a fresh `event_id`; legacy-lane events use the flat [LEGACY] shapes. One
typed builder per GA event kind is in server_event_builders.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

from vllm_omni.protocol.errors import ProtocolError, error_class
from vllm_omni.protocol.server_event_types import ERROR, SESSION_CREATED


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": new_id("event_"), **fields}


def error_event(exc: ProtocolError, client_event_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": error_class(exc.code), "code": exc.code, "message": exc.message}
    client_event_id = client_event_id if client_event_id is not None else exc.event_id
    if client_event_id is not None:
        body["event_id"] = client_event_id
    if exc.param is not None:
        body["param"] = exc.param
    return event(ERROR, error=body)


def flat_error(code: str, message: str) -> dict[str, Any]:
    """[LEGACY] / route-level error shape."""
    return {"type": ERROR, "error": message, "code": code}


def session_created(session: dict[str, Any], legacy_id: str) -> dict[str, Any]:
    """Readable by both dialects: GA `session` plus legacy `id` / `created` (docs/realtime-api.md §1.5)."""
    return event(SESSION_CREATED, session=session, id=legacy_id, created=int(time.time()))


def response_object(response_id: str, status: str, *, modalities: list[str], output: list[dict],
                    output_format: dict, voice: str | None, max_output_tokens: Any,
                    conversation_id: str | None, status_details: Any = None, usage: Any = None,
                    metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """`metadata`: the client's, as given (None: none was)."""
    obj = {"id": response_id, "object": "realtime.response", "status": status, "status_details": status_details,
           "output": output, "output_modalities": modalities, "modalities": modalities,
           "conversation_id": conversation_id, "audio": {"output": {"format": output_format, "voice": voice}},
           "max_output_tokens": max_output_tokens, "metadata": metadata}
    if usage is not None:
        obj["usage"] = usage
    return obj


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
