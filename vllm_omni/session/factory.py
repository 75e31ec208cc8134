"""Which session a connection gets: from the route it came by (lane asked for) and the deploy's
`session_mode` (docs/realtime-api.md §1.1, §1.3, §13). A new session kind is a module plus an
entry here; the server only calls `route` and the opener it returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from vllm_omni.audio.formats import AudioFormat
from vllm_omni.audio.pcm import MODEL_RATE
from vllm_omni.engine.interface import EngineClient, UnitEngine
from vllm_omni.protocol.duplex_view import duplex_view
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.query_flags import query_flag
from vllm_omni.protocol.server_event_builders import session_updated
from vllm_omni.protocol.server_event_types import SESSION_CREATED
from vllm_omni.protocol.server_events import event, new_id, session_created
from vllm_omni.protocol.session_config import SessionConfig, TurnDetection
from vllm_omni.protocol.states import SessionMode
from vllm_omni.session.base import Emit, RealtimeSession, SessionOptions, ga_only
from vllm_omni.session.core import SessionCore
from vllm_omni.session.lanes import DuplexLane, GaLane, check_model_fields
from vllm_omni.session.legacy_session import LegacySession
from vllm_omni.session.native_opening import native_opening, native_settings
from vllm_omni.session.overlap_input import OverlapTurnInput
from vllm_omni.session.session import InputPolicy, Session
from vllm_omni.session.turn_input import TurnInput
from vllm_omni.session.turn_lanes import TurnLanes
from vllm_omni.session.unit_input import UnitInput

DUPLEX_INPUT = AudioFormat("pcm16", MODEL_RATE)  # the duplex lane's default input (docs/realtime-api.md §13.2)

Opener = Callable[[str, Emit, bool], RealtimeSession]  # (model, emit, extensions) -> the session, greeted


@dataclass(frozen=True)
class DuplexRoute:
    """The duplex lane: no session exists at accept. The connection's handshake opens one with
    its autostart `{"model": …}` or first session object (docs/realtime-api.md §13.1)."""

    # (opening session object, default model, emit, session id, extra session.created fields)
    open: Callable[[dict[str, Any], str, Emit, str, dict[str, Any]], Session]


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
        return DuplexRoute(lambda opening, model, emit, session_id, created: open_duplex_session(
            self.engine, self.options, opening, model, emit, session_id=session_id, created_fields=created))

    def _open_turn(self, model: str, emit: Emit, extensions: bool) -> RealtimeSession:
        """A turn-mode session: GA lane, or legacy if the client's first events ask for it;
        session.created goes out at once. Without `extensions` the GA lane speaks pure GA
        (docs/realtime-api.md §1.3); the legacy lane always speaks its own vocabulary."""
        ga = self._open_ga(model, emit, extensions)
        return TurnLanes(ga, lambda: LegacySession(self.engine, ga.config, self.options, emit))

    def open_ga(self, model: str, emit: Emit) -> Session:
        """A pure-GA session (a WebRTC call: OpenAI's GA interface, no legacy dialect, no
        extensions); raises SessionRefused where this deploy serves no turn sessions."""
        if self.options.session_mode is not SessionMode.TURN:
            raise SessionRefused("this deploy serves the duplex lane; WebRTC calls need a turn-mode deploy")
        return self._open_ga(model, emit, extensions=False)

    def _open_ga(self, model: str, emit: Emit, extensions: bool) -> Session:
        # As in GA, a GA session starts with server VAD (the deploy's defaults; turn_detection:
        # null turns it off); a session that asked for our extensions starts with manual turns.
        vad = None if extensions else TurnDetection(**self.options.turn_detection_defaults)
        config = SessionConfig(id=new_id("sess_"), model=model, turn_detection=vad)
        ga_emit = emit if extensions else ga_only(emit)
        ga = ga_session(self.engine, config, self.options, ga_emit)
        ga_emit(session_created(ga.session_object(), legacy_id=new_id("sess-")))
        return ga


def ga_session(engine: EngineClient, config: SessionConfig, options: SessionOptions, emit: Emit) -> Session:
    """A GA-lane session with turn input (not greeted)."""
    return Session(engine, config, options, emit, lane=GaLane, policy=TurnInput)


def open_duplex_session(engine: EngineClient, options: SessionOptions, opening: dict[str, Any],
                        model: str, emit: Emit, *, session_id: str | None = None,
                        created_fields: Mapping[str, Any] | None = None) -> Session:
    """A duplex-lane session opened with the `opening` session object (docs/realtime-api.md
    §13.1): session.created, then session.updated with the same object. Its input is the
    model's: units for a natively duplex model, else turns. Raises ProtocolError (the
    connection then ends) when the object cannot open one: `model_not_found`, or
    `invalid_session_config` naming the problem."""
    check_model_fields(opening)
    model = opening.get("model") or model
    if model not in options.served_models:
        raise ProtocolError("model_not_found", f"The model `{str(model)[:200]}` does not exist.", "model")
    policy: Callable[[SessionCore], InputPolicy]
    if not isinstance(engine, UnitEngine):
        if opening.get("ref_audio") is not None:
            raise ProtocolError("invalid_duplex_runtime_config", "this model takes no ref_audio (it has no voice "
                                "cloning); choose a voice", "ref_audio")
        policy, settings = OverlapTurnInput, None
    else:  # the model-facing fields are read before the opening applies
        settings = native_settings(opening, options, engine)
        policy = partial(UnitInput, native=engine, auto_response=settings.auto_response)

    def duplex_emit(server_event: dict[str, Any]) -> None:
        emit(duplex_view(server_event, epoch=session.responses.epoch))

    config = SessionConfig(id=session_id or new_id("duplex-"), model=model, input_format=DUPLEX_INPUT)
    session = Session(engine, config, options, duplex_emit, lane=DuplexLane, policy=policy)
    session.lane_part.open(opening)
    model_opening = None if settings is None else native_opening(opening, session.config.wants_audio, settings,
                                                                  engine.needs_voice_prompt)
    # resume credentials (attachment_generation, resume_token) ride on session.created only
    duplex_emit(event(SESSION_CREATED, session=session.session_object(), **(created_fields or {})))
    duplex_emit(session_updated(session=session.session_object()))
    if isinstance(session.policy, UnitInput):
        session.policy.start(model_opening)  # the model's context prefill runs first, ahead of any input
    return session
