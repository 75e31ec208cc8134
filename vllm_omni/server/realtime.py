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
import hmac
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
from vllm_omni.protocol.client_events import MAX_EVENT_BYTES, SessionClose, parse_client_event
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_events import error_event, event, flat_error, new_id, session_created
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.session.legacy_session import LegacySession
from vllm_omni.session.turn_session import TurnSession

logger = logging.getLogger(__name__)

TRUE_VALUES = {"1", "true", "yes", "on"}
FALSE_VALUES = {"0", "false", "no", "off"}
SEND_QUEUE_HIGH_WATER = 256  # events; producers pause above this
CLOSE_EVENTS = {"session.close", "close", "close_session"}


@dataclass
class ServerSettings:
    served_model_names: list[str]
    api_key: str | None = None
    max_sessions: int = 64
    max_session_duration_s: float = 3600.0
    vad_model_path: str | None = None
    default_speaker: str = "ethan"


class _Outbox:
    """Ordered outgoing events and the one task that writes them."""

    def __init__(self, websocket: WebSocket):
        self.websocket = websocket
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
            while True:
                await self._ready.wait()
                self._ready.clear()
                while self._events:
                    payload = self._events.popleft()
                    await self.websocket.send_text(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))
                    if len(self._events) <= SEND_QUEUE_HIGH_WATER // 2:
                        self._drained.set()
        except (WebSocketDisconnect, RuntimeError):
            self._closed = True
            self._drained.set()

    async def flush_and_stop(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self._events and not self._closed and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._closed = True
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def _authorized(websocket: WebSocket, api_key: str | None) -> bool:
    if not api_key:
        return True
    header = websocket.headers.get("authorization", "")
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",")]
    candidates = [header[7:]] if header.lower().startswith("bearer ") else []
    candidates += [p[len("openai-insecure-api-key."):] for p in offered if p.startswith("openai-insecure-api-key.")]
    return any(hmac.compare_digest(c.encode(), api_key.encode()) for c in candidates)


class RealtimeConnection:
    def __init__(self, websocket: WebSocket, engine: Any, settings: ServerSettings, sessions: list[int]):
        self.websocket, self.engine, self.settings = websocket, engine, settings
        self._sessions = sessions  # shared one-element counter of open sessions
        self.outbox: _Outbox | None = None
        self.lane: str | None = None
        self.session: TurnSession | LegacySession | None = None  # the lane's session, once chosen
        self.turn: TurnSession | None = None
        self._early_appends: list[dict[str, Any]] = []
        self._holds_slot = False  # counted in `sessions`

    async def serve(self) -> None:
        ws = self.websocket
        if not _authorized(ws, self.settings.api_key):
            await ws.send_denial_response(JSONResponse({"error": "Unauthorized"}, status_code=401))
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
            await ws.send_text(json.dumps(error_event(ProtocolError("model_not_found",
                                                                    f"The model `{model}` does not exist.",
                                                                    "model"))))
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
        self.outbox = _Outbox(ws)
        config = SessionConfig(id=new_id("sess_"), model=model)
        self.turn = TurnSession(self.engine, config, self.settings.served_model_names, emit=self.outbox.put,
                                default_speaker=self.settings.default_speaker, speakers=self.engine.speakers,
                                vad_model_path=self.settings.vad_model_path)
        self.outbox.put(session_created(self.turn.session_object(), legacy_id=new_id("sess-")))
        try:
            await self._receive_loop()
        finally:
            if self.session is not None:
                await self.session.close()
            await self.outbox.flush_and_stop()
            if ws.client_state == WebSocketState.CONNECTED:
                with contextlib.suppress(RuntimeError):
                    await ws.close(1000)
            self._release_slot()

    def _release_slot(self) -> None:
        """Free this connection's session slot (once)."""
        if self._holds_slot:
            self._holds_slot = False
            self._sessions[0] -= 1
            metrics.ACTIVE_SESSIONS.dec()

    async def _end(self, reason: str) -> None:
        """Terminal: session.closed, flush, close 1000 (GA lane); plain close on the legacy lane.
        The session's work is cancelled and its slot freed before `session.closed` goes out,
        so a client may open its next session at once."""
        if self.session is not None:
            await self.session.close()
            self.session = None
        self._release_slot()
        if self.lane != "legacy":
            self.outbox.put(event("session.closed", session_id=self.turn.config.id, reason=reason, event={}))
        await self.outbox.flush_and_stop()
        await self.websocket.close(1000, reason)

    async def _receive_loop(self) -> None:
        started = time.monotonic()
        while True:
            idle = self.turn.config.idle_timeout_s
            remaining = self.settings.max_session_duration_s - (time.monotonic() - started)
            if remaining <= 0:
                await self._end("max_duration")
                return
            try:
                message = await asyncio.wait_for(self.websocket.receive(), timeout=min(idle, remaining))
            except asyncio.TimeoutError:
                await self._end("idle_timeout" if idle <= remaining else "max_duration")
                return
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                self._report(ProtocolError("bad_event", "binary frames are not supported"), None)
                continue
            if len(text.encode()) > MAX_EVENT_BYTES:
                self._report(ProtocolError("event_too_large", "event exceeds 15 MiB"), None)
                continue
            try:
                raw = json.loads(text)
            except json.JSONDecodeError:
                self._report(ProtocolError("invalid_json", "Invalid JSON event"), None)
                continue
            if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
                self._report(ProtocolError("bad_event", "event must be an object with a string 'type'"), None)
                continue
            if raw["type"] in CLOSE_EVENTS and self.lane != "legacy":
                await self._end(SessionClose.model_validate(raw).reason or "client_close")
                return
            await self._dispatch(raw)
            await self.outbox.wait_writable()

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
                self._early_appends.append(raw)
                return
            for early in self._early_appends:
                await self._apply(early)
            self._early_appends = []
        await self._apply(raw)

    async def _apply(self, raw: dict[str, Any]) -> None:
        if self.lane == "legacy":
            await self.session.handle(raw)
            return
        client_event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
        try:
            await self.turn.handle(parse_client_event(raw))
        except ProtocolError as exc:
            self._report(exc, client_event_id)
        except Exception as exc:  # a bug in one handler must not end the session
            logger.exception("event %s failed", raw.get("type"))
            self._report(ProtocolError("internal_error", f"{type(exc).__name__}: {exc}"), client_event_id)
