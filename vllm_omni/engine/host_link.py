"""What the engine host (engine/engine_host.py) and the API frontends it serves
(engine/remote_engine.py) say to each other.

Each message is a tuple whose first item names it, pickled behind its 4-byte length, over a
Unix socket in a private (0700) folder that only this server's processes reach. Frontend to
host: ("generate", request), ("call", call_id, method, args) for `abort` and `owner`, and
("claim", session_id, address) / ("release", session_id) for the session directory. Host to
frontend: ("hello", EngineDescription), ("status", EngineStatus) every STATUS_INTERVAL_S,
("output", request_id, EngineOutput), ("failed", request_id, exception) and
("reply", call_id, value).
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from dataclasses import dataclass
from typing import Any

from vllm_omni.engine.replicas import ReplicaStats
from vllm_omni.engine.request import AudioInputStream

STATUS_INTERVAL_S = 0.25  # how stale /health and the replica metrics of a frontend can be
_LENGTH = struct.Struct("!I")


@dataclass(frozen=True)
class EngineDescription:
    """What a frontend's sessions ask of the engine that never changes."""

    speakers: list[str]
    default_speaker: str | None
    output_sample_rate: int
    accepts_images: bool
    audio_stream_type: type[AudioInputStream]  # the family's: the frontend computes log-mel itself


@dataclass(frozen=True)
class EngineStatus:
    """Health and load, as /health and /metrics report them."""

    unhealthy_stages: list[str]
    num_active_requests: int
    active_requests_by_stage: dict[str, int]
    replica_stats: list[ReplicaStats]


def write_message(writer: asyncio.StreamWriter, message: tuple[Any, ...]) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_LENGTH.pack(len(body)) + body)


async def read_message(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    """The next message; raises asyncio.IncompleteReadError when the other side is gone."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(length))
