"""What the engine host (engine/engine_host.py) and the API frontends it serves
(engine/remote_engine.py) say to each other.

Each message is one of the frozen dataclasses below (its class is its tag), pickled behind
its 4-byte length, over a Unix socket in a private (0700) folder that only this server's
processes reach. Frontend to host (`ToHost`): Generate, Call (`abort`, `owner`) and, for the
duplex session directory, Claim / Release. Host to frontend (`ToFrontend`): Hello, Status
every STATUS_INTERVAL_S, Output / Failed per request, Reply per call.
"""

from __future__ import annotations

import asyncio
import enum
import pickle
import struct
from dataclasses import dataclass
from typing import Any

from vllm_omni.engine.replicas import ReplicaStats
from vllm_omni.engine.request import AudioInputStream, EngineOutput, OmniRequest

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


class Method(enum.Enum):
    """What a frontend may ask the host and wait for."""

    ABORT = "abort"  # (request_id,) -> whether it was running
    OWNER = "owner"  # (session_id,) -> the address of the frontend that serves it, or None


@dataclass(frozen=True)
class Generate:
    request: OmniRequest  # its audio already as features


@dataclass(frozen=True)
class Call:
    call_id: int
    method: Method
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Claim:
    """Duplex sessions with this id are served by the frontend at `address`."""

    session_id: str
    address: str


@dataclass(frozen=True)
class Release:
    session_id: str


@dataclass(frozen=True)
class Hello:
    description: EngineDescription


@dataclass(frozen=True)
class Status:
    status: EngineStatus


@dataclass(frozen=True)
class Output:
    request_id: str
    output: EngineOutput


@dataclass(frozen=True)
class Failed:
    request_id: str
    error: Exception


@dataclass(frozen=True)
class Reply:
    call_id: int
    value: Any


ToHost = Generate | Call | Claim | Release
ToFrontend = Hello | Status | Output | Failed | Reply


def write_message(writer: asyncio.StreamWriter, message: ToHost | ToFrontend) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_LENGTH.pack(len(body)) + body)


async def read_message(reader: asyncio.StreamReader) -> ToHost | ToFrontend:
    """The next message; raises asyncio.IncompleteReadError when the other side is gone."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(length))
