"""Turning one inbound WebSocket text frame into a JSON object, defensively.

Python's `json` accepts things a client event must not carry and that would fail later,
far from the frame that caused them: `NaN` / `Infinity` literals, lone UTF-16 surrogates
(`"\\ud800"` decodes to a `str` that cannot be encoded back to UTF-8, so echoing it kills
the writer), and nesting deep enough to exhaust the interpreter's recursion limit. Each of
these becomes a `ProtocolError` naming the problem, so the session answers with an `error`
event and goes on.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from vllm_omni.protocol.client_events import client_event_id
from vllm_omni.protocol.errors import ProtocolError

MAX_EVENT_BYTES = 15 * 1024 * 1024  # the application event limit (the GA API caps one append alike)
MAX_NESTING = 32  # objects/arrays inside one event; real events nest 5 deep at most
# A `\uD800`-`\uDFFF` escape: only frames that contain one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF][0-9a-fA-F]{2}")


def _reject_constant(name: str) -> Any:
    raise ProtocolError("invalid_json", f"Invalid JSON event: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError("invalid_json", f"Invalid JSON event: {text[:40]} is out of range")
    return value


def _check_structure(value: Any, check_strings: bool) -> None:
    """Depth of nesting and (when asked) that every string is valid Unicode text."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, dict):
            children = list(node.items())
        elif isinstance(node, list):
            children = [(None, child) for child in node]
        else:
            if check_strings and isinstance(node, str):
                _check_text(node)
            continue
        if depth > MAX_NESTING:
            raise ProtocolError("bad_event", f"event nests deeper than {MAX_NESTING} levels")
        for key, child in children:
            if check_strings and key is not None:
                _check_text(key)
            pending.append((child, depth + 1))


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError("invalid_json", "Invalid JSON event: a string holds a lone UTF-16 surrogate") from None


def decode_client_frame(text: str) -> dict[str, Any]:
    """The JSON object of one text frame; raises ProtocolError (event_too_large,
    invalid_json, bad_event)."""
    if len(text) > MAX_EVENT_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_EVENT_BYTES:
        raise ProtocolError("event_too_large", "event exceeds 15 MiB")
    try:
        raw = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except ValueError:  # JSONDecodeError, and integers longer than Python converts (4300 digits)
        raise ProtocolError("invalid_json", "Invalid JSON event") from None
    except RecursionError:
        raise ProtocolError("bad_event", f"event nests deeper than {MAX_NESTING} levels") from None
    _check_structure(raw, check_strings=_SURROGATE_ESCAPE.search(text) is not None)
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ProtocolError("bad_event", "event must be an object with a string 'type'", "type",
                            event_id=client_event_id(raw) if isinstance(raw, dict) else None)
    return raw
