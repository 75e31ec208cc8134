"""The engine of another process, as an API frontend sees it (engine/engine_host.py).

`RemoteEngine` speaks the same interface as `OmniEngine` (engine/interface.py), so sessions
cannot tell them apart. User audio is turned into log-mel features here, in the frontend,
before a request leaves. Health and load come from the status the host publishes; when the
host goes away every request in flight fails and `closed` is set.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

from vllm_omni.engine import host_link as link
from vllm_omni.engine.host_link import EngineDescription, EngineStatus, read_message, write_message
from vllm_omni.engine.replicas import ReplicaStats
from vllm_omni.engine.request import (
    AudioInputStream,
    EngineOutput,
    OmniRequest,
    RequestFinished,
    StageUnavailableError,
)

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 10.0
HOST_GONE = "the engine host went away"


class RemoteEngine:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 description: EngineDescription, status: EngineStatus):
        self._reader, self._writer = reader, writer
        self._description, self._status = description, status
        self._streams: dict[str, asyncio.Queue] = {}  # request id -> its outputs (or the exception that ended it)
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self.closed = asyncio.Event()
        self._reading = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, socket_path: str) -> RemoteEngine:
        async def handshake() -> RemoteEngine:
            reader, writer = await asyncio.open_unix_connection(socket_path)
            hello, status = await read_message(reader), await read_message(reader)
            if not isinstance(hello, link.Hello) or not isinstance(status, link.Status):
                raise ConnectionError(f"the engine host greeted with {type(hello).__name__}, {type(status).__name__}")
            return cls(reader, writer, hello.description, status.status)

        return await asyncio.wait_for(handshake(), CONNECT_TIMEOUT_S)

    # The engine interface ---------------------------------------------------------------

    @property
    def speakers(self) -> list[str]:
        return self._description.speakers

    @property
    def default_speaker(self) -> str | None:
        return self._description.default_speaker

    @property
    def output_sample_rate(self) -> int:
        return self._description.output_sample_rate

    @property
    def accepts_images(self) -> bool:
        return self._description.accepts_images

    def create_audio_stream(self) -> AudioInputStream:
        return self._description.audio_stream_type()

    async def generate(self, request: OmniRequest) -> AsyncIterator[EngineOutput]:
        if self.closed.is_set():
            raise StageUnavailableError(HOST_GONE)
        for message in request.messages:
            if message.audio_stream is not None:
                message.audio_stream.close()  # the features travel, not the samples
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request.request_id] = outputs
        finished = False
        try:
            self._send(link.Generate(request))
            while True:
                item = await outputs.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                finished = isinstance(item, RequestFinished)
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request.request_id, None)
            if not finished and not self.closed.is_set():  # the caller stopped listening
                self._send(link.Call(next(self._call_ids), link.Method.ABORT, (request.request_id,)))

    async def abort(self, request_id: str) -> bool:
        return bool(await self._call(link.Method.ABORT, request_id))

    def unhealthy_stages(self) -> list[str]:
        return self._status.unhealthy_stages

    def num_active_requests(self) -> int:
        return self._status.num_active_requests

    def active_requests_by_stage(self) -> dict[str, int]:
        return self._status.active_requests_by_stage

    def replica_stats(self) -> list[ReplicaStats]:
        return self._status.replica_stats

    def shutdown(self) -> None:
        self._writer.close()

    # The duplex session directory (server/duplex_registry.py) ---------------------------

    def claim(self, session_id: str, address: str) -> None:
        """Sessions with this id are served by the frontend at `address`."""
        self._notify(link.Claim(session_id, address))

    def release(self, session_id: str) -> None:
        self._notify(link.Release(session_id))

    async def owner(self, session_id: str) -> str | None:
        """The address of the frontend that serves the session, if one does."""
        return await self._call(link.Method.OWNER, session_id)

    # The link ---------------------------------------------------------------------------

    def _send(self, message: link.ToHost) -> None:
        if self.closed.is_set():
            raise StageUnavailableError(HOST_GONE)
        write_message(self._writer, message)

    def _notify(self, message: link.ToHost) -> None:
        """A message whose loss does not matter once the host is gone (with it, the directory)."""
        if not self.closed.is_set():
            write_message(self._writer, message)

    async def _call(self, method: link.Method, *args: Any) -> Any:
        call_id = next(self._call_ids)
        reply = self._calls[call_id] = asyncio.get_running_loop().create_future()
        try:
            self._send(link.Call(call_id, method, args))
            return await asyncio.wait_for(reply, CALL_TIMEOUT_S)
        finally:
            self._calls.pop(call_id, None)

    async def _read(self) -> None:
        try:
            while True:
                self._dispatch(await read_message(self._reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()
            failure = StageUnavailableError(HOST_GONE)
            for outputs in self._streams.values():
                outputs.put_nowait(failure)
            for reply in self._calls.values():
                if not reply.done():
                    reply.set_exception(failure)

    def _dispatch(self, message: link.ToFrontend) -> None:
        match message:
            case link.Status(status):
                self._status = status
            case link.Output(request_id, item) | link.Failed(request_id, item):
                outputs = self._streams.get(request_id)
                if outputs is not None:  # else a request its caller has left
                    outputs.put_nowait(item)
            case link.Reply(call_id, value):
                reply = self._calls.get(call_id)
                if reply is not None and not reply.done():
                    reply.set_result(value)
            case _:
                logger.error("the engine host sent an unexpected message %r", type(message).__name__)
