"""A realtime session: the core (session/core.py), a lane part (session/lanes.py) and an input
policy (turn input, turn input on the duplex lane, or unit input), composed here, and the one
table that dispatches client events to them, built once.

Client events are applied one at a time, in arrival order (`handle`). Outgoing events go
through `emit`, which only enqueues, so everything a handler emits leaves in the order it
was produced. Responses run as tasks of this session and end with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.request import OmniRequest
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import session_updated
from vllm_omni.protocol.server_events import error_event
from vllm_omni.protocol.session_config import SessionConfig, session_object
from vllm_omni.protocol.states import Lane
from vllm_omni.session.base import Emit, SessionOptions, reporting
from vllm_omni.session.core import Handler, Handlers, InputHooks, SessionCore
from vllm_omni.session.input_track import InputTrack, SealedTurn
from vllm_omni.session.item_store import ItemStore
from vllm_omni.session.lanes import DuplexLane, GaLane
from vllm_omni.session.response import ResponseRun
from vllm_omni.session.response_controller import ResponseController


class InputPolicy(InputHooks, Protocol):
    """How the client's input reaches the model, and what starts a response."""

    mode: str  # how session.update reads this session's fields (protocol/session_update.py)

    def handlers(self) -> Handlers:
        """The input events and response.create, as this input takes them."""

    def capabilities(self) -> dict[str, Any]:
        """`session.capabilities` (docs/realtime-api.md §2.6)."""

    def check_update(self, update: dict[str, Any]) -> None:
        """Raise ProtocolError for a session.update field this input cannot take once open."""

    async def close(self) -> None:
        """Stop what the policy started."""


P = TypeVar("P", bound=InputPolicy)


class Session(Generic[P]):
    def __init__(self, engine: EngineClient, config: SessionConfig, options: SessionOptions, emit: Emit, *,
                 lane: type[GaLane | DuplexLane], policy: Callable[[SessionCore], P]):
        self.core = SessionCore(engine, config, options, emit, hooks=self)
        self.policy: P = policy(self.core)
        self.lane_part = lane(self.core, self.policy.mode)
        # Every client event this session takes (by canonical type; client_events.ALIASES spell
        # some of them differently) and what applies it. session.close is the connection's.
        self._handlers: Mapping[str, Handler] = MappingProxyType({
            **self.core.handlers(), "session.update": self._update_session,
            **self.lane_part.handlers(self._dispatch), **self.policy.handlers()})

    # What a connection and the tests read -----------------------------------------------------

    @property
    def lane(self) -> Lane:
        return self.lane_part.lane

    @property
    def id(self) -> str:
        return self.core.id

    @property
    def idle_timeout_s(self) -> float:
        return self.core.config.idle_timeout_s

    @property
    def config(self) -> SessionConfig:
        return self.core.config

    @property
    def input(self) -> InputTrack:
        return self.core.input

    @property
    def items(self) -> ItemStore:
        return self.core.items

    @property
    def responses(self) -> ResponseController:
        return self.core.responses

    @property
    def turn_id(self) -> int:
        return self.core.turn_id

    def session_object(self) -> dict[str, Any]:
        return session_object(self.core.config, {**self.core.state(), "capabilities": self.capabilities()})

    def capabilities(self) -> dict[str, Any]:
        return self.policy.capabilities()

    def report(self, exc: ProtocolError, client_event_id: str | None = None) -> None:
        self.core.emit(error_event(exc, client_event_id))

    # Dispatch ---------------------------------------------------------------------------------

    async def handle(self, ev: dict[str, Any] | ce.ClientEvent) -> None:
        """Apply one client event, decoded (parsed here) or already parsed."""
        await reporting(self, ev, self._dispatch(ev))

    async def _dispatch(self, ev: dict[str, Any] | ce.ClientEvent) -> None:
        if not isinstance(ev, ce.ClientEvent):
            ev = ce.parse_client_event(ev)
        handler = self._handlers.get(ce.canonical_type(ev.type))
        if handler is None:
            raise ProtocolError("unknown_event", f"Unknown event type: {ev.type}", "type")
        pending = handler(ev)
        if pending is not None:
            await pending

    def _update_session(self, ev: ce.SessionUpdate) -> None:
        update = ev.session if ev.session is not None else ({"model": ev.model} if ev.model else {})
        self.apply_update(update, ev.event_id)

    def apply_update(self, update: dict[str, Any], event_id: str | None = None) -> None:
        """Apply `update` as the lane does; session.updated unless nothing applied
        (docs/realtime-api.md §2.2, §13.2)."""
        self.policy.check_update(update)
        result = self.lane_part.update(update)
        for problem in result.rejected:
            self.report(problem, event_id)
        if result.updated:
            self.core.adopt(result.config)
            self.core.emit(session_updated(session=self.session_object()))

    # The core's reports, for the input policy (InputHooks) ------------------------------------

    def speech_started(self) -> None:
        self.policy.speech_started()

    def server_commit(self, sealed: SealedTurn) -> None:
        self.policy.server_commit(sealed)

    def produce(self, run: ResponseRun, request: OmniRequest, previous_item_id: str | None) -> None:
        self.policy.produce(run, request, previous_item_id)

    def response_cancelled(self) -> None:
        self.policy.response_cancelled()

    # End --------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop everything this session started (no cancelled response.done is sent)."""
        await self.policy.close()
        await self.core.close()
