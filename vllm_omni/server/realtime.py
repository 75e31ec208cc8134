"""`/v1/realtime` in turn mode: one connection = one session, legacy or GA lane.

The lane is chosen by the first `session.update` (a top-level `model` and no `session`
object: legacy) or by the first event that is neither that nor an append (GA); appends
received before the choice are replayed into the chosen lane (realtime-protocol.md §1.2).

Outgoing events go through one bounded-by-consumer queue and a single writer task, so
events leave in the order they were produced and a slow client only slows its own
session. Every wait has a deadline: the socket idle timeout and the session's maximum
duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect, WebSocketState

from vllm_omni.metrics import prometheus as metrics
from vllm_omni.protocol.client_events import MAX_ID_CHARS, parse_client_event
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.frames import decode_client_frame
from vllm_omni.protocol.server_events import error_event, event, flat_error, new_id, session_created
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.server.auth import UNAUTHORIZED, authorized
from vllm_omni.session.legacy_session import LegacySession
from vllm_omni.session.turn_session import DEFAULT_MAX_HISTORY_AUDIO_S, TurnSession

logger = logging.getLogger(__name__)

TRUE_VALUES = {"1", "true", "yes", "on"}
FALSE_VALUES = {"0", "false", "no", "off"}
SEND_QUEUE_HIGH_WATER = 256  # events; producers pause above this
MAX_EARLY_APPEND_CHARS = 16 * 1024 * 1024  # base64 audio held while the lane is undecided
FLUSH_TIMEOUT_S = 5.0  # what is queued when a session ends gets this long to leave
STOP_TIMEOUT_S = 10.0  # for a session's work to stop
CLOSE_TIMEOUT_S = 5.0  # for the close handshake
MAX_CLOSE_REASON_BYTES = 123  # what a WebSocket close frame can carry
CLOSE_EVENTS = {"session.close", "close", "close_session"}


@dataclass
class ServerSettings:
    served_model_names: list[str]
    api_key: str | None = None
    max_sessions: int = 64
    max_session_duration_s: float = 3600.0
    vad_model_path: str | None = None
    default_speaker: str = "ethan"
    send_timeout_s: float = 30.0  # a client that takes no event for this long is dropped
    max_history_audio_s: float = DEFAULT_MAX_HISTORY_AUDIO_S  # user speech a conversation keeps
    protect_metrics: bool = False  # /metrics needs the API key too


class _Outbox:
    """Ordered outgoing events and the one task that writes them.

    The writer ends when the socket does, when one send takes longer than `send_timeout_s`
    (a peer that stopped reading: the transport's own keepalive cannot notice it once the
    write buffer is full), or on a bug; `task` finishing is the signal to end the session.
    """

    def __init__(self, websocket: WebSocket, send_timeout_s: float):
        self.websocket = websocket
        self.send_timeout_s = send_timeout_s
        self._events: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._closed = False
        self.task = asyncio.create_task(self._write(), name="realtime-writer")

    def put(self, payload: dict[str, Any]) -> None:
        if self._closed:
            return
        if payload.get("type") == "error":
            code = payload.get("code") or payload.get("error", {}).get("code", "unknown")
            metrics.ERRORS.labels(code=str(code)).inc()
        self._events.append(payload)
        self._ready.set()
        if len(self._events) > SEND_QUEUE_HIGH_WATER:
            self._drained.clear()

    async def wait_writable(self) -> None:
        await self._drained.wait()

    async def _write(self) -> None:
        try:
            while not (self._closed and not self._events):
                await self._ready.wait()
                self._ready.clear()
                while self._events:
                    text = json.dumps(self._events.popleft(), ensure_ascii=False, separators=(",", ":"))
                    await asyncio.wait_for(self.websocket.send_text(text), self.send_timeout_s)
                    if len(self._events) <= SEND_QUEUE_HIGH_WATER // 2:
                        self._drained.set()
        except asyncio.TimeoutError:
            logger.warning("client read nothing for %.0f s: dropping the connection", self.send_timeout_s)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the socket is gone
        except Exception:
            logger.exception("writing an event failed: ending the session")
        finally:
            self._closed = True
            self._drained.set()

    async def flush_and_stop(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        """Send what is queued (within `timeout`), then stop the writer."""
        self._closed = True  # nothing new is queued; the writer ends once the queue is empty
        self._ready.set()
        done, _ = await asyncio.wait({self.task}, timeout=timeout)
        if not done:
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=timeout)


class RealtimeConnection:
    def __init__(self, websocket: WebSocket, engine: Any, settings: ServerSettings, sessions: list[int]):
        self.websocket, self.engine, self.settings = websocket, engine, settings
        self._sessions = sessions  # shared one-element counter of open sessions
        self.outbox: _Outbox | None = None
        self.lane: str | None = None
        self.session: TurnSession | LegacySession | None = None  # the lane's session, once chosen
        self.turn: TurnSession | None = None
        self._early_appends: list[dict[str, Any]] = []
        self._early_chars = 0
        self._holds_slot = False  # counted in `sessions`
        self._close_reason = "session_ended"
        self._work_stopped = False

    async def serve(self) -> None:
        ws = self.websocket
        if not authorized(ws.headers, self.settings.api_key):
            await ws.send_denial_response(JSONResponse(UNAUTHORIZED, status_code=401))
            return
        offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        duplex = ws.query_params.get("duplex")
        if duplex is not None and duplex.lower() in TRUE_VALUES:
            await ws.send_text(json.dumps(flat_error("unsupported", "VAD realtime is not enabled")))
            await ws.close(1008, "unsupported")
            return
        model = ws.query_params.get("model") or self.settings.served_model_names[0]
        if model not in self.settings.served_model_names:
            await ws.send_text(json.dumps(error_event(ProtocolError(
                "model_not_found", f"The model `{model[:200]}` does not exist.", "model"))))
            await ws.close(1008, "model_not_found")
            return
        if self._sessions[0] >= self.settings.max_sessions:
            await ws.send_text(json.dumps(error_event(ProtocolError(
                "resource_exhausted", f"session_capacity_exhausted: limit={self.settings.max_sessions}"))))
            await ws.close(1013, "resource_exhausted")
            return
        self._sessions[0] += 1
        self._holds_slot = True
        metrics.ACTIVE_SESSIONS.inc()
        metrics.SESSIONS_TOTAL.inc()
        try:
            self.outbox = _Outbox(ws, self.settings.send_timeout_s)
            config = SessionConfig(id=new_id("sess_"), model=model)
            self.turn = TurnSession(self.engine, config, self.settings.served_model_names, emit=self.outbox.put,
                                    default_speaker=self.settings.default_speaker, speakers=self.engine.speakers,
                                    vad_model_path=self.settings.vad_model_path,
                                    max_history_audio_s=self.settings.max_history_audio_s)
            self.outbox.put(session_created(self.turn.session_object(), legacy_id=new_id("sess-")))
            await self._receive_loop()
        except Exception:  # a bug of ours: the session still ends cleanly below
            logger.exception("realtime session failed")
            self._close_reason = "internal_error"
        finally:
            await self._teardown()

    async def _stop_work(self) -> None:
        """Cancel everything the session started, once (bounded: a stuck engine call cannot
        keep the slot). `_end` stops it early and `_teardown` runs after every session."""
        if self._work_stopped:
            return
        self._work_stopped = True
        session = self.session or self.turn
        if session is not None:
            try:
                await asyncio.wait_for(session.close(), STOP_TIMEOUT_S)
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
                await asyncio.wait_for(self.websocket.close(1000, reason), CLOSE_TIMEOUT_S)

    def _release_slot(self) -> None:
        """Free this connection's session slot (once)."""
        if self._holds_slot:
            self._holds_slot = False
            self._sessions[0] -= 1
            metrics.ACTIVE_SESSIONS.dec()

    async def _end(self, reason: str) -> None:
        """Terminal: the session's work is cancelled and its slot freed before `session.closed`
        goes out (GA lane; the legacy lane just closes), so a client may open its next
        session at once. The socket is closed by `_teardown`."""
        await self._stop_work()
        self._release_slot()
        self._close_reason = reason
        if self.lane != "legacy":
            self.outbox.put(event("session.closed", session_id=self.turn.config.id, reason=reason, event={}))

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
            idle = self.turn.config.idle_timeout_s
            remaining = self.settings.max_session_duration_s - (time.monotonic() - started)
            if remaining <= 0:
                await self._end("max_duration")
                return
            try:
                message = await self._next_message(min(idle, remaining))
            except asyncio.TimeoutError:
                await self._end("idle_timeout" if idle <= remaining else "max_duration")
                return
            if message is None or message["type"] == "websocket.disconnect":
                self._close_reason = "disconnect"
                return
            text = message.get("text")
            try:
                if text is None:
                    raise ProtocolError("bad_event", "binary frames are not supported")
                raw = decode_client_frame(text)
            except ProtocolError as exc:
                self._report(exc, None)
                continue
            if raw["type"] in CLOSE_EVENTS and self.lane != "legacy":
                if await self._close_requested(raw):
                    return
                continue
            await self._dispatch(raw)
            await self.outbox.wait_writable()

    async def _close_requested(self, raw: dict[str, Any]) -> bool:
        """A session.close: True when the session ended, False when the event was invalid."""
        try:
            close = parse_client_event(raw)
        except ProtocolError as exc:
            self._report(exc, _client_event_id(raw))
            return False
        await self._end(getattr(close, "reason", None) or "client_close")
        return True

    def _report(self, exc: ProtocolError, client_event_id: str | None) -> None:
        if self.lane == "legacy":
            self.outbox.put(flat_error(exc.code, exc.message))
        else:
            self.outbox.put(error_event(exc, client_event_id))

    def _choose_lane(self, raw: dict[str, Any]) -> bool:
        """Pick the lane if this event decides it; False while still undecided."""
        if raw["type"] == "input_audio_buffer.append":
            return False
        legacy = raw["type"] == "session.update" and "session" not in raw and isinstance(raw.get("model"), str)
        self.lane = "legacy" if legacy else "ga"
        if legacy:
            self.session = LegacySession(self.engine, self.settings.served_model_names, emit=self.outbox.put,
                                         default_speaker=self.settings.default_speaker)
        else:
            self.session = self.turn
        return True

    async def _dispatch(self, raw: dict[str, Any]) -> None:
        if self.lane is None:
            if not self._choose_lane(raw):
                size = len(str(raw.get("audio") or raw.get("delta") or ""))
                if self._early_chars + size > MAX_EARLY_APPEND_CHARS:
                    self._report(ProtocolError("input_backpressure", "send session.update (or another event) "
                                               "before more audio"), _client_event_id(raw))
                    return
                self._early_chars += size
                self._early_appends.append(raw)
                return
            for early in self._early_appends:
                await self._apply(early)
            self._early_appends, self._early_chars = [], 0
        await self._apply(raw)

    async def _apply(self, raw: dict[str, Any]) -> None:
        client_event_id = _client_event_id(raw)
        try:
            if self.lane == "legacy":
                await self.session.handle(raw)
            else:
                await self.turn.handle(parse_client_event(raw))
        except ProtocolError as exc:
            self._report(exc, client_event_id)
        except Exception as exc:  # a bug in one handler must not end the session
            logger.exception("event %s failed", raw.get("type"))
            self._report(ProtocolError("internal_error", f"internal error ({type(exc).__name__}) applying "
                                                         f"{raw['type'][:100]}"), client_event_id)


def _client_event_id(raw: dict[str, Any]) -> str | None:
    event_id = raw.get("event_id")
    return event_id if isinstance(event_id, str) and len(event_id) <= MAX_ID_CHARS else None
