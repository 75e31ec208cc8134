"""Named kinds and states the wire carries as strings (str enums: they compare equal to, and
serialise as, their values)."""

from __future__ import annotations

from enum import Enum


class Lane(str, Enum):
    """A connection's dialect (docs/realtime-api.md §1.2)."""

    GA = "ga"  # turn mode, GA events
    LEGACY = "legacy"  # turn mode, the vLLM transcription-style vocabulary
    DUPLEX = "duplex"  # duplex mode, GA events plus the [EXT] duplex surface


class SessionMode(str, Enum):
    """The deploy's `session_mode`: which handler serves /v1/realtime (docs/realtime-api.md §1.1)."""

    TURN = "turn"
    DUPLEX = "duplex"


class ResponseStatus(str, Enum):
    """`response.status` (docs/realtime-api.md §5.7)."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"  # a token limit the client set ended it
    CANCELLED = "cancelled"
    FAILED = "failed"
