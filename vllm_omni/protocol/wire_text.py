"""An event's text on the socket: compact UTF-8 JSON, made once per event. The duplex lane's
resume journal sizes each event by this text and the connection's writer sends the same text
(docs/realtime-api.md §13.4), so a journaled event is encoded once, not twice."""

from __future__ import annotations

import json
from typing import Any


def compact_json(wire: dict[str, Any]) -> str:
    return json.dumps(wire, ensure_ascii=False, separators=(",", ":"))


class EncodedEvent(dict[str, Any]):
    """A wire event that carries its `compact_json` text, made when it is built: do not change
    the event afterwards (the text would no longer say what it holds)."""

    __slots__ = ("text",)

    def __init__(self, wire: dict[str, Any]):
        super().__init__(wire)
        self.text = compact_json(self)


def wire_text(wire: dict[str, Any]) -> str:
    """The text the socket sends for `wire`: its own if it carries one."""
    return wire.text if isinstance(wire, EncodedEvent) else compact_json(wire)
