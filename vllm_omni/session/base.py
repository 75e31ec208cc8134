"""What a connection holds: one session of some kind behind this small interface."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from vllm_omni.protocol.client_events import ClientEvent, client_event_id
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.ga_view import ga_view
from vllm_omni.protocol.states import Lane, SessionMode

logger = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], None]  # queues one server event; never blocks
DEFAULT_MAX_HISTORY_AUDIO_S = 1200.0  # user speech a conversation keeps (as log-mel features: ~61 MB)


def ga_only(emit: Emit) -> Emit:
    """`emit` for a connection that did not ask for extensions: each event goes out in its
    pure-GA view, and extension events not at all (docs/realtime-api.md §1.3)."""

    def send(event: dict[str, Any]) -> None:
        view = ga_view(event)
        if view is not None:
            emit(view)

    return send


@dataclass(frozen=True)
class NativeDuplexSettings:
    """A deploy's settings for natively duplex sessions (docs/realtime-api.md §13.7)."""

    allow_test_decisions: bool = False  # sessions may script the model's decisions (tests only)
    continuation_limit_units: int = 64  # silence units one response may be fed
    continuation_period_ms: float = 1000.0  # no input for this long while the model speaks: a silence unit


@dataclass(frozen=True)
class SessionOptions:
    """What every session of a server gets from its deploy."""

    served_models: list[str]
    session_mode: SessionMode = SessionMode.TURN
    vad_model_path: str | None = None  # None: the HF cache, then the silero-vad package
    end_of_turn_model_path: str | None = None  # semantic_vad's; None: the pipecat-ai package's copy
    default_speaker: str | None = None  # None: the engine's default voice
    max_history_audio_s: float = DEFAULT_MAX_HISTORY_AUDIO_S
    max_sessions: int = 64  # sessions the server admits at once
    # server-VAD fields (protocol.session_config.TURN_DETECTION_DEFAULT_FIELDS) a client that
    # turns server_vad on without them gets; the rest keep the built-in defaults
    turn_detection_defaults: dict[str, float] = field(default_factory=dict)
    native_duplex: NativeDuplexSettings = NativeDuplexSettings()


class RealtimeSession(Protocol):
    """A session of any kind (turn, legacy, duplex…), as its connection drives it."""

    @property
    def lane(self) -> Lane | None:
        """The connection's dialect; None while a turn-mode connection has not chosen it yet."""

    @property
    def id(self) -> str:
        """The session id (`sess_…`)."""

    @property
    def idle_timeout_s(self) -> float:
        """How long the connection may stay silent before the session ends."""

    async def handle(self, raw: dict[str, Any]) -> None:
        """Apply one decoded client event. What goes wrong becomes this lane's error event
        (`report`) and the session goes on; it never raises."""

    def report(self, exc: ProtocolError, client_event_id: str | None = None) -> None:
        """Send `exc` as this lane's error event."""

    async def close(self) -> None:
        """Stop everything the session started; nothing more is emitted for it."""


async def reporting(session: RealtimeSession, ev: dict[str, Any] | ClientEvent, apply: Awaitable[None]) -> None:
    """Await `apply` (the handling of `ev`): a ProtocolError becomes an error event naming the
    client's event id, and a bug in one handler an `internal_error`; neither ends the session."""
    event_id = ev.event_id if isinstance(ev, ClientEvent) else client_event_id(ev)
    kind = ev.type if isinstance(ev, ClientEvent) else str(ev.get("type"))
    try:
        await apply
    except ProtocolError as exc:
        session.report(exc, event_id)
    except Exception as exc:
        logger.exception("event %s failed", kind)
        session.report(ProtocolError("internal_error", f"internal error ({type(exc).__name__}) applying "
                                                       f"{kind[:100]}"), event_id)
