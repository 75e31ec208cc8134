"""Named kinds and states the wire carries as strings (str enums: they compare equal to, and
serialise as, their values)."""

from __future__ import annotations

from enum import Enum


class Lane(str, Enum):
    """A connection's dialect (realtime-protocol.md §1.2)."""

    GA = "ga"  # turn mode, GA events
    LEGACY = "legacy"  # turn mode, the vLLM transcription-style vocabulary
    DUPLEX = "duplex"  # duplex mode, GA events plus the [EXT] duplex surface


class SessionMode(str, Enum):
    """The deploy's `session_mode`: which handler serves /v1/realtime (§1.1)."""

    TURN = "turn"
    DUPLEX = "duplex"


class ResponseStatus(str, Enum):
    """`response.status` (§4.10)."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"  # a token limit the client set ended it
    CANCELLED = "cancelled"
    FAILED = "failed"
