"""`/v1/realtime` and `/v1/duplex`: one connection = one session.

The connection authenticates, asks the session factory which session the route gets on this
deploy (or a route-level refusal), admits (model, capacity), then pumps: decoded client frames
into the session, the session's events out through the outbox. It names no session kind and
no lane rule. Every wait has a deadline: the socket idle timeout and the session's maximum
duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketState

from vllm_omni.protocol.client_events import ClientEvent, canonical_type, client_event_id, parse_client_event
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.frames import decode_client_frame
from vllm_omni.protocol.ga_view import EXTENSIONS_QUERY, wants_extensions
from vllm_omni.protocol.server_event_builders import session_closed
from vllm_omni.protocol.server_events import error_event, flat_error
from vllm_omni.protocol.states import Lane
from vllm_omni.server.auth import UNAUTHORIZED, authorized
from vllm_omni.server.duplex_handshake import NEEDS_OPENING_FIELDS, autostart, close_code, first_message, wait_for_text
from vllm_omni.server.duplex_link import DuplexLink
from vllm_omni.server.duplex_registry import DuplexRegistry
from vllm_omni.server.duplex_relay import relay_resume
from vllm_omni.server.frontend_identity import FrontendIdentity
from vllm_omni.server.outbox import Outbox
from vllm_omni.server.settings import ServerSettings
from vllm_omni.server.slots import SessionSlots
from vllm_omni.session.base import RealtimeSession
from vllm_omni.session.factory import DuplexRoute, SessionFactory, SessionRefused
from vllm_omni.session.resume_journal import ResumeRefused

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # for a session's work to stop
CLOSE_TIMEOUT_S = 5.0  # for the close handshake
MAX_CLOSE_REASON_BYTES = 123  # what a WebSocket close frame can carry


class RealtimeConnection:
    def __init__(self, websocket: WebSocket, factory: SessionFactory, settings: ServerSettings,
                 slots: SessionSlots, duplex_sessions: DuplexRegistry, *, duplex_endpoint: bool = False,
                 frontend: FrontendIdentity | None = None):
        self.websocket, self.factory, self.settings = websocket, factory, settings
        self.slots, self.duplex_sessions = slots, duplex_sessions
        self.frontend = frontend  # one of several API frontends: resumes may belong to another
        self.duplex_endpoint = duplex_endpoint  # came by /v1/duplex
        self.outbox: Outbox | None = None
        self.session: RealtimeSession | None = None
        self._release_slot: Callable[[], None] = lambda: None  # a turn session's slot
        self.duplex: DuplexLink | None = None  # the duplex session this connection serves
        self._close_reason = "session_ended"
        self._close_code = 1000
        self._work_stopped = False
        # [EXT] events and fields only for a client that asks (docs/realtime-api.md §1.3)
        self.extensions = wants_extensions(websocket.query_params.get(EXTENSIONS_QUERY))

    async def serve(self) -> None:
        ws = self.websocket
        if not authorized(ws.headers, self.settings.api_key):
            await ws.send_denial_response(JSONResponse(UNAUTHORIZED, status_code=401))
            return
        offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        try:
            route = self.factory.route(duplex_endpoint=self.duplex_endpoint,
                                       duplex_query=ws.query_params.get("duplex"))
        except SessionRefused as refused:
            await ws.send_text(json.dumps(flat_error(refused.code, refused.message)))
            await ws.close(1008, refused.code)
            return
        except ProtocolError as problem:
            await ws.send_text(json.dumps(error_event(problem)))
            await ws.close(1008, problem.code)
            return
        model = ws.query_params.get("model") or self.settings.served_model_names[0]
        if model not in self.settings.served_model_names:
            await ws.send_text(json.dumps(error_event(ProtocolError(
                "model_not_found", f"The model `{model[:200]}` does not exist.", "model"))))
            await ws.close(1008, "model_not_found")
            return
        if isinstance(route, DuplexRoute):
            self.outbox = Outbox(ws, self.settings.send_timeout_s)
            await self._run(self._open_duplex(route, model))
            return
        release = self.slots.take()
        if release is None:
            await ws.send_text(json.dumps(error_event(ProtocolError(
                "resource_exhausted", f"session_capacity_exhausted: limit={self.settings.max_sessions}"))))
            await ws.close(1013, "resource_exhausted")
            return
        self._release_slot = release
        self.outbox = Outbox(ws, self.settings.send_timeout_s)
        self.session = route(model, self.outbox.put, self.extensions)
        await self._run(None)

    async def _run(self, opening: Awaitable[bool] | None) -> None:
        """The session's life on this connection: its opening (duplex), the receive loop, and the
        teardown however it ends."""
        try:
            if opening is None or await opening:
                await self._receive_loop()
        except Exception:  # a bug of ours: the session still ends cleanly below
            logger.exception("realtime session failed")
            self._close_reason = "internal_error"
        finally:
            await self._teardown()

    async def _open_duplex(self, route: DuplexRoute, model: str) -> bool:
        """The duplex handshake (docs/realtime-api.md §13.1): open or resume; False when it failed
        (its error sent, the close code set). The duplex lane always has the extension surface."""
        self.extensions = True
        self.duplex = DuplexLink(self.duplex_sessions, self.slots, self.outbox,
                                 on_detached=lambda: asyncio.ensure_future(self.outbox.flush_and_stop()))
        query = dict(self.websocket.query_params)
        try:
            handshake = autostart(query)
            if handshake is not None:
                try:
                    self.duplex.open(route, handshake, model)
                except ProtocolError as problem:
                    if problem.code not in NEEDS_OPENING_FIELDS:
                        raise
                    handshake = None
            if handshake is None:
                handshake = await first_message(query, lambda t: wait_for_text(self.websocket.receive, t))
                if handshake.resume is not None:
                    owner = await self._other_owner(handshake.resume.session_id)
                    if owner is not None:
                        end = await relay_resume(self.websocket, owner, handshake.resume, self.settings.api_key)
                        self._close_code, self._close_reason = end.code, end.reason
                        return False
                    self.duplex.resume(handshake.resume)
                else:
                    self.duplex.open(route, handshake, model)
        except ConnectionError:
            self._close_reason = "disconnect"
            return False
        except ResumeRefused as refused:
            self.outbox.put(refused.event)
            self._close_reason, self._close_code = refused.close_reason, refused.close_code
            return False
        except ProtocolError as problem:
            self.outbox.put(error_event(problem))
            self._close_reason, self._close_code = problem.code, close_code(problem)
            return False
        self.session = self.duplex.session
        if handshake.first is not None:
            await self.session.handle(handshake.first)
        return True

    async def _other_owner(self, session_id: str) -> str | None:
        """The address of the frontend that serves `session_id` when it is not this one."""
        if self.frontend is None or self.duplex_sessions.get(session_id) is not None:
            return None
        owner = await self.frontend.directory.owner(session_id)
        return owner if owner != self.frontend.address else None

    async def _stop_work(self) -> None:
        """Cancel everything the session started, once (bounded: a stuck engine call cannot
        keep the slot). `_end` stops it early and `_teardown` runs after every session. A
        duplex session is not the connection's to stop: it is detached (§13.4)."""
        if self._work_stopped:
            return
        self._work_stopped = True
        if self.duplex is not None:
            self.duplex.connection_gone()
        elif self.session is not None:
            try:
                await asyncio.wait_for(self.session.close(), STOP_TIMEOUT_S)
            except Exception:
                logger.exception("stopping the session's work failed")

    async def _teardown(self) -> None:
        """However the session ended: its work stops, its slot frees, then what is queued is
        flushed and the socket closed, each step with a deadline."""
        await self._stop_work()
        self._release_slot()
        if self.outbox is not None:
            await self.outbox.flush_and_stop()
        if self.websocket.client_state == WebSocketState.CONNECTED:
            reason = self._close_reason.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.websocket.close(self._close_code, reason), CLOSE_TIMEOUT_S)

    async def _end(self, reason: str) -> None:
        """Terminal: the session's work is cancelled and its slot freed before `session.closed`
        goes out ([EXT]: GA lane with extensions; otherwise the socket just closes, with the
        reason), so a client may open its next session at once. On the duplex lane it goes
        through the session's journal, numbered like every event before it (docs/realtime-api.md
        §13.4). The socket is closed by `_teardown`."""
        if self.duplex is not None:
            await self.duplex.end(reason)
        await self._stop_work()
        self._release_slot()
        self._close_reason = reason
        closed = session_closed(session_id=self.session.id, reason=reason)
        if self.duplex is not None:
            self.duplex.entry.emit(closed)
        elif self.extensions and self.session.lane is not Lane.LEGACY:
            self.outbox.put(closed)

    async def _next_message(self, timeout: float) -> dict[str, Any] | None:
        """The next ASGI message, or None when the writer has ended (the peer is gone or stuck).
        Raises TimeoutError after `timeout`."""
        receive = asyncio.ensure_future(self.websocket.receive())
        done, _ = await asyncio.wait({receive, self.outbox.task}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if receive in done:
            return receive.result()
        receive.cancel()
        await asyncio.gather(receive, return_exceptions=True)
        if self.outbox.task.done():
            return None
        raise asyncio.TimeoutError

    async def _receive_loop(self) -> None:
        started = time.monotonic()
        while True:
            idle = self.session.idle_timeout_s
            remaining = self.settings.max_session_duration_s - (time.monotonic() - started)
            if remaining <= 0:
                await self._end("max_duration")
                return
            try:
                message = await self._next_message(min(idle, remaining))
            except asyncio.TimeoutError:
                if idle <= remaining and self.duplex is not None:  # a silent socket: detach (§13.4)
                    self._close_reason = "idle_timeout"
                    return
                await self._end("idle_timeout" if idle <= remaining else "max_duration")
                return
            if message is None or message["type"] == "websocket.disconnect":
                self._close_reason = self.duplex.close_reason if self.duplex else "disconnect"
                return
            text = message.get("text")
            try:
                if text is None:
                    raise ProtocolError("bad_event", "binary frames are not supported")
                raw = decode_client_frame(text)
            except ProtocolError as exc:
                self._report_transport(exc)
                continue
            if self.duplex is not None and self._duplex_control(raw):
                continue
            if self.duplex is not None:
                self.duplex.entry.touch()  # activity renews the session's lease
            if canonical_type(raw["type"]) == "session.close" and self.session.lane is not Lane.LEGACY:
                if await self._close_requested(raw):
                    return
                continue
            client_event = self._parsed(raw) if self.duplex is not None else raw
            if client_event is not None:
                await self.session.handle(client_event)
            await self.outbox.wait_writable()

    def _parsed(self, raw: dict[str, Any]) -> ClientEvent | None:
        """A duplex client event, validated here: an event that fails validation is a transport
        error, reported to this connection and never journaled (docs/realtime-api.md §13.4)."""
        try:
            return parse_client_event(raw)
        except ProtocolError as problem:
            self.duplex.report(problem, client_event_id(raw))
            return None

    def _report_transport(self, problem: ProtocolError) -> None:
        """A frame that did not decode: the duplex lane does not journal such errors."""
        if self.duplex is not None:
            self.duplex.report(problem)
        else:
            self.session.report(problem)

    def _duplex_control(self, raw: dict[str, Any]) -> bool:
        """The duplex lane's connection-level events (docs/realtime-api.md §13.4); True if `raw`
        was one."""
        if raw["type"] == "session.event_ack":
            self.duplex.acknowledge(raw)
            return True
        if raw["type"] == "session.resume":
            self.duplex.report(ProtocolError("unsupported_session_resume", "session.resume must be the first "
                                             "message of a new connection"), client_event_id(raw))
            return True
        return False

    async def _close_requested(self, raw: dict[str, Any]) -> bool:
        """A session.close: True when the session ended, False when the event was invalid."""
        try:
            close = parse_client_event(raw)
        except ProtocolError as exc:
            self.session.report(exc, client_event_id(raw))
            return False
        await self._end(getattr(close, "reason", None) or "client_close")
        return True
