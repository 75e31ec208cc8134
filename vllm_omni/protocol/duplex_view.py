"""The duplex lane's spelling of server events (docs/realtime-api.md §13.3).

Sessions build their errors with GA's codes (the GA lane's contract); the duplex lane keeps
the reference vocabulary its clients were written against, so a duplex connection receives
`duplex_view(event)`: the same events, with those codes respelled.
"""

from __future__ import annotations

import re
from typing import Any

from vllm_omni.protocol import server_event_types as kinds

DUPLEX_CODES = {
    "input_audio_buffer_commit_empty": "input_audio_buffer_empty",
    "conversation_already_has_active_response": "response_already_active",
    "response_cancel_not_active": "response_not_active",
    "invalid_value": "bad_event",
}
_UNKNOWN_ITEM = re.compile(r"item_[a-z]+_invalid_item_id")


def duplex_code(code: str, param: str | None) -> str:
    """The duplex lane's code for a GA-lane error code."""
    if _UNKNOWN_ITEM.fullmatch(code):
        return "item_not_found"
    if code == "missing_required_parameter":
        return "missing_item_id" if param == "item_id" else "bad_event"
    return DUPLEX_CODES.get(code, code)


def duplex_view(event: dict[str, Any]) -> dict[str, Any]:
    """`event` as the duplex lane spells it."""
    if event["type"] != kinds.ERROR or not isinstance(event.get("error"), dict):
        return event
    error = event["error"]
    code = duplex_code(error["code"], error.get("param"))
    return event if code == error["code"] else {**event, "error": {**error, "code": code}}
