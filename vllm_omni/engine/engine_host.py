"""One engine, served to API frontends in other processes (`vllm-omni serve --api-server-count N`).

The engine and its stages stay in the host process; each frontend connects over a Unix
socket (engine/host_link.py) and drives it through a `RemoteEngine`. A frontend's requests
live as long as its connection: when a frontend goes away, every request it started is
aborted. The host also keeps the directory of which frontend owns each duplex session, so a
`session.resume` that reaches another frontend can be relayed to the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from vllm_omni.engine import host_link as link
from vllm_omni.engine.host_link import STATUS_INTERVAL_S, EngineDescription, EngineStatus, read_message, write_message
from vllm_omni.engine.interface import ServedEngine, UnitEngine
from vllm_omni.engine.request import OmniRequest

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 30.0  # a frontend that reads nothing for this long is dropped
HIGH_WATER_BYTES = 1 << 20  # outputs buffered for a frontend beyond which its requests wait


def describe(engine: ServedEngine) -> EngineDescription:
    return EngineDescription(engine.speakers, engine.default_speaker, engine.output_sample_rate,
                             engine.accepts_images, type(engine.create_audio_stream()))


def engine_status(engine: ServedEngine) -> EngineStatus:
    return EngineStatus(engine.unhealthy_stages(), engine.num_active_requests(),
                        engine.active_requests_by_stage(), engine.replica_stats())


@dataclass(eq=False)
class _Frontend:
    writer: asyncio.StreamWriter
    requests: dict[str, asyncio.Task] = field(default_factory=dict)
    sessions: set[str] = field(default_factory=set)  # duplex sessions it claimed

    def send(self, message: link.ToFrontend) -> None:
        if not self.writer.is_closing():
            write_message(self.writer, message)

    async def flow(self) -> None:
        """Wait while the frontend is behind (raises TimeoutError if it stays behind)."""
        if self.writer.transport.get_write_buffer_size() > HIGH_WATER_BYTES:
            await asyncio.wait_for(self.writer.drain(), DRAIN_TIMEOUT_S)


def refusal(engine: ServedEngine) -> str | None:
    """Why `engine` cannot be served to several frontends (None: it can)."""
    if isinstance(engine, UnitEngine):
        return ("several API frontends serve turn-based models only: a native duplex model keeps each "
                "session's state in the process that runs it (use --api-server-count 1)")
    return None


class EngineHost:
    def __init__(self, engine: ServedEngine, socket_path: str):
        problem = refusal(engine)
        if problem is not None:
            raise ValueError(problem)
        self.engine, self.socket_path = engine, socket_path
        self._description = describe(engine)
        self._frontends: set[_Frontend] = set()
        self._owners: dict[str, str] = {}  # duplex session id -> its frontend's private address
        self._server: asyncio.Server | None = None
        # The loop keeps only weak references to tasks: these are held here until they end.
        self._tasks: set[asyncio.Task] = set()
        self._status: asyncio.Task | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.socket_path)
        self._status = self._spawn(self._publish_status())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._status is not None:
            self._status.cancel()
        for frontend in list(self._frontends):
            frontend.writer.close()

    async def _publish_status(self) -> None:
        while True:
            status = engine_status(self.engine)
            for frontend in list(self._frontends):
                frontend.send(link.Status(status))
            await asyncio.sleep(STATUS_INTERVAL_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frontend = _Frontend(writer)
        self._frontends.add(frontend)
        frontend.send(link.Hello(self._description))
        frontend.send(link.Status(engine_status(self.engine)))
        try:
            while True:
                self._handle(frontend, await read_message(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await self._forget(frontend)

    def _handle(self, frontend: _Frontend, message: link.ToHost) -> None:
        match message:
            case link.Generate(request):
                frontend.requests[request.request_id] = self._spawn(self._generate(frontend, request))
            case link.Call(call_id, method, args):
                self._spawn(self._call(frontend, call_id, method, args))
            case link.Claim(session_id, address):
                self._owners[session_id] = address
                frontend.sessions.add(session_id)
            case link.Release(session_id):
                self._owners.pop(session_id, None)
                frontend.sessions.discard(session_id)
            case _:
                logger.error("a frontend sent an unknown message %r", type(message).__name__)

    async def _generate(self, frontend: _Frontend, request: OmniRequest) -> None:
        try:
            async for output in self.engine.generate(request):
                frontend.send(link.Output(request.request_id, output))
                await frontend.flow()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            frontend.send(link.Failed(request.request_id, exc))
        finally:
            frontend.requests.pop(request.request_id, None)

    async def _call(self, frontend: _Frontend, call_id: int, method: link.Method, args: tuple[Any, ...]) -> None:
        if method is link.Method.ABORT:
            value: Any = await self.engine.abort(*args)
        else:
            value = self._owners.get(*args)
        frontend.send(link.Reply(call_id, value))

    async def _forget(self, frontend: _Frontend) -> None:
        """A frontend went away: its requests stop (the engine aborts a request whose caller
        stops listening) and its sessions leave the directory."""
        self._frontends.discard(frontend)
        for task in list(frontend.requests.values()):
            task.cancel()
        await asyncio.gather(*frontend.requests.values(), return_exceptions=True)
        for session_id in frontend.sessions:
            self._owners.pop(session_id, None)
        with contextlib.suppress(Exception):
            frontend.writer.close()
