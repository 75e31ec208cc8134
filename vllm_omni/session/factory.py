"""Which session a connection gets: from the route it came by (lane asked for) and the deploy's
`session_mode` (docs/realtime-api.md §1.1, §1.3, §13). A new session kind is a module plus an
entry here; the server only calls `route` and the opener it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_omni.engine.interface import EngineClient
from vllm_omni.protocol.query_flags import query_flag
from vllm_omni.protocol.server_events import new_id, session_created
from vllm_omni.protocol.session_config import SessionConfig, TurnDetection
from vllm_omni.protocol.states import SessionMode
from vllm_omni.session.base import Emit, RealtimeSession, SessionOptions, ga_only
from vllm_omni.session.duplex_session import DuplexSession, open_duplex_session
from vllm_omni.session.legacy_session import LegacySession
from vllm_omni.session.native_duplex_session import NativeDuplexSession
from vllm_omni.session.turn_lanes import TurnLanes
from vllm_omni.session.turn_session import TurnSession

Opener = Callable[[str, Emit, bool], RealtimeSession]  # (model, emit, extensions) -> the session, greeted


@dataclass(frozen=True)
class DuplexRoute:
    """The duplex lane: no session exists at accept. The connection's handshake opens one with
    its autostart `{"model": …}` or first session object (docs/realtime-api.md §13.1)."""

    # (opening session object, default model, emit, session id, extra session.created fields)
    open: Callable[[dict[str, Any], str, Emit, str, dict[str, Any]], DuplexSession]


class SessionRefused(Exception):
    """No session kind serves this route on this deploy: a route-level error (the flat shape),
    sent before any session exists; the socket then closes with 1008."""

    def __init__(self, message: str, code: str = "unsupported"):
        super().__init__(message)
        self.code, self.message = code, message


class SessionFactory:
    def __init__(self, engine: EngineClient, options: SessionOptions):
        self.engine = engine
        self.options = options

    def route(self, *, duplex_endpoint: bool, duplex_query: str | None) -> Opener | DuplexRoute:
        """How a connection to /v1/duplex (`duplex_endpoint`) or to /v1/realtime with this
        `duplex` query value gets its session; raises SessionRefused where this deploy has no
        session kind for it, ProtocolError for a `duplex` value that is no boolean."""
        duplex_asked = query_flag("duplex", duplex_query)
        if self.options.session_mode is SessionMode.TURN:
            if duplex_endpoint:
                raise SessionRefused("Duplex API is not available")
            if duplex_asked:
                raise SessionRefused("VAD realtime is not enabled")
            return self._open_turn
        if not duplex_endpoint and duplex_asked is False:
            raise SessionRefused("Realtime API is not available")
        kind = DuplexSession if self.engine.native_duplex is None else NativeDuplexSession
        return DuplexRoute(lambda opening, model, emit, session_id, created: open_duplex_session(
            self.engine, self.options, opening, model, emit, session_id=session_id, created_fields=created,
            kind=kind))

    def _open_turn(self, model: str, emit: Emit, extensions: bool) -> RealtimeSession:
        """A turn-mode session: GA lane, or legacy if the client's first events ask for it;
        session.created goes out at once. Without `extensions` the GA lane speaks pure GA
        (docs/realtime-api.md §1.3); the legacy lane always speaks its own vocabulary."""
        # As in GA, a GA session starts with server VAD (the deploy's defaults; turn_detection:
        # null turns it off); a session that asked for our extensions starts with manual turns.
        vad = None if extensions else TurnDetection(**self.options.turn_detection_defaults)
        config = SessionConfig(id=new_id("sess_"), model=model, turn_detection=vad)
        ga_emit = emit if extensions else ga_only(emit)
        ga = TurnSession(self.engine, config, self.options, ga_emit)
        ga_emit(session_created(ga.session_object(), legacy_id=new_id("sess-")))
        return TurnLanes(ga, lambda: LegacySession(self.engine, config, self.options, emit))
