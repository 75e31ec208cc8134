"""A turn-mode realtime session (GA lane): its parts wired together, and the one table that
dispatches client events to them.

Client events are applied one at a time, in arrival order (`handle`). Outgoing events go
through `emit`, which only enqueues, so everything a handler emits leaves in the order it
was produced. Responses run as tasks of this session and end with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from vllm_omni.audio.pcm import MODEL_RATE
from vllm_omni.engine.interface import EngineClient
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import (
    CommitRecord,
    audio_buffer_cleared,
    audio_buffer_committed,
    heartbeat_ack,
    input_transcription_completed,
    item_done,
    overlap_decision,
    session_updated,
)
from vllm_omni.protocol.server_events import error_event
from vllm_omni.protocol.session_config import SessionConfig, session_object
from vllm_omni.protocol.session_update import SessionUpdateResult, apply_session_update
from vllm_omni.protocol.states import Lane
from vllm_omni.session.base import ConfiguredSession, Emit, SessionOptions, reporting
from vllm_omni.session.capabilities import Kind, capabilities
from vllm_omni.session.conversation import announce
from vllm_omni.session.input_track import InputTrack, SealedTurn
from vllm_omni.session.item_store import ItemStore
from vllm_omni.session.response_controller import ResponseController
from vllm_omni.session.tools import engine_tool_choice, engine_tools
from vllm_omni.session.transcriber import Transcriber

Handler = Callable[[Any], Awaitable[None] | None]
# Malformed tools are refused by session.update, not at the next answer (docs/realtime-api.md §2.3)
TOOL_CHECKS = {"tools": lambda tools: engine_tools(tools, "session.tools"),
               "tool_choice": lambda choice: engine_tool_choice(choice, "session.tool_choice")}


class TurnSession(ConfiguredSession):
    lane = Lane.GA
    mode = "turn"  # how session.update reads turn detection (interrupt_response's default)
    capability_kind: Kind = "turn"  # its column of session.capabilities

    def __init__(self, engine: EngineClient, config: SessionConfig, options: SessionOptions, emit: Emit):
        self.engine = engine
        self.config = config
        self.options = options
        self._emit = emit
        self.turn_id = 0  # user turns committed
        self.turn_state = "idle"  # while no response generates (a duplex client's turn.signal sets it)
        self.input = InputTrack(engine, emit, vad_model_path=options.vad_model_path,
                                end_of_turn_model_path=options.end_of_turn_model_path,
                                on_speech_started=self._speech_started, on_server_commit=self._server_commit,
                                busy=lambda: self.responses.active is not None)
        self.items = ItemStore(engine, emit, session_id=config.id,
                               max_history_audio_ms=int(options.max_history_audio_s * 1000),
                               input_format=lambda: self.config.input_format)
        self.responses = ResponseController(
            engine, emit, conversation=self.items.conversation, config=lambda: self.config,
            default_speaker=options.default_speaker, resolve_input=self.items.response_input,
            on_started=self.input.disarm_idle_timer,
            on_completed=lambda run: self.input.arm_idle_timer(run.item.audio_duration_ms))
        self.transcriber = Transcriber(engine, emit, config.id, answer_audio=lambda: (
            self.responses.active.audio_started if self.responses.active is not None else None))
        # Every client event this lane takes (by canonical type; client_events.ALIASES spell some
        # of them differently) and what applies it. session.close is the connection's.
        self._handlers: dict[str, Handler] = {
            "session.update": self._update_session,
            "input_audio_buffer.append": lambda ev: self.input.append(ev, self.config.input_format),
            "input_audio_buffer.commit": self._commit_input,
            "input_audio_buffer.clear": self._clear_input,
            "input.cancel": self._cancel_input,
            "input.text.append": self._append_text,
            "conversation.item.create": self._create_item,
            "conversation.item.delete": self.items.delete,
            "conversation.item.retrieve": self.items.retrieve,
            "conversation.item.truncate": self._truncate_item,
            "response.create": self.responses.create,
            "response.cancel": self.responses.cancel,
            "output_audio_buffer.clear": self.responses.clear_output,
            "playback.ack": self.responses.playback_ack,
            "session.heartbeat": lambda ev: self._emit(heartbeat_ack(session_id=self.id)),
        }
        self.input.configure(config.turn_detection)

    def session_object(self) -> dict[str, Any]:
        active = self.responses.active
        return session_object(self.config, {
            "state": "open", "turn_state": "assistant_generating" if active else self.turn_state,
            "epoch": self.responses.epoch, "turn_id": self.turn_id,
            "active_request_id": active.request_id if active else None,
            "active_response_id": active.id if active else None, "active_response_turn_id": None,
            "playback": dict(active.playback) if active else
            {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0},
            "capabilities": self.capabilities()})

    def capabilities(self) -> dict[str, Any]:
        """`session.capabilities`: what this session kind and model support (docs/realtime-api.md §2.6)."""
        return capabilities(self.capability_kind, max_sessions=self.options.max_sessions,
                            image_input=self.engine.accepts_images)

    def report(self, exc: ProtocolError, client_event_id: str | None = None) -> None:
        self._emit(error_event(exc, client_event_id))

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

    # Handlers ---------------------------------------------------------------------------------

    def _update_session(self, ev: ce.SessionUpdate) -> None:
        update = ev.session if ev.session is not None else ({"model": ev.model} if ev.model else {})
        self.apply_update(update, ev.event_id)

    def apply_update(self, update: dict[str, Any], event_id: str | None = None) -> None:
        """Apply what is valid; one error per rejected group, then session.updated unless nothing
        applied (docs/realtime-api.md §2.2)."""
        result = self._session_update(update)
        for problem in result.rejected:
            self.report(problem, event_id)
        if result.updated:
            self._adopt(result.config)

    def _session_update(self, update: dict[str, Any]) -> SessionUpdateResult:
        return apply_session_update(self.config, update, self.options.served_models, mode=self.mode,
                                    vad_defaults=self.options.turn_detection_defaults, checks=TOOL_CHECKS)

    def _adopt(self, config: SessionConfig) -> None:
        """`config` becomes the session's; session.updated says so."""
        before, self.config = self.config.turn_detection, config
        if self.config.turn_detection != before:
            self.input.configure(self.config.turn_detection)
        self._emit(session_updated(session=self.session_object()))

    def _commit_input(self, ev: ce.InputAudioBufferCommit) -> None:
        self._commit(self.input.commit())
        wants_response = ev.create_response if ev.create_response is not None else ev.response_create
        if wants_response is None:
            wants_response = ev.type == "input.commit"  # that spelling answers by default
        if wants_response:
            self.responses.respond_or_defer()

    def _clear_input(self, ev: ce.ClientEvent) -> None:
        self.input.clear()
        self._emit(audio_buffer_cleared())

    def _cancel_input(self, ev: ce.ClientEvent) -> None:
        """input.cancel: drop the input and stop the answer (barge-in by the client)."""
        self.input.clear()
        if not self._barge_in("barge_in"):
            self._emit(audio_buffer_cleared())

    def _append_text(self, ev: ce.InputTextAppend) -> None:
        if not isinstance(ev.text, str):
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'text'.", "text")
        raise ProtocolError("native_text_append_unsupported", "send text as a conversation.item.create user message")

    async def _create_item(self, ev: ce.ConversationItemCreate) -> None:
        item = await self.items.create(ev)
        if item.role in ("user", "tool"):
            self.responses.unanswered = True

    def _truncate_item(self, ev: ce.ConversationItemTruncate) -> None:
        self.responses.truncated(*self.items.truncate(ev))

    # What the input track reports -------------------------------------------------------------

    def _speech_started(self) -> None:
        td = self.config.turn_detection
        if self.responses.active is not None and td is not None and td.interrupt_response:
            self._emit(overlap_decision(session_id=self.id, epoch=self.responses.epoch, policy="barge_in_on_speech",
                                        action="barge_in", reason="server_vad_speech_started", metadata={}))
            self._barge_in("turn_detected")

    def _barge_in(self, reason: str) -> bool:
        """The user interrupts: the active response is cancelled (False: none was active)."""
        return self.responses.cancel_active(reason)

    def _server_commit(self, sealed: SealedTurn) -> None:
        self._commit(sealed)
        if self.config.turn_detection.create_response:
            self.responses.respond_or_defer()

    def _commit(self, sealed: SealedTurn, flags: tuple[str, ...] = ()) -> None:
        """The commit fan-out of a sealed user turn (docs/realtime-api.md §6.0 C(X)); `flags`
        mark the committed record (an empty back-channel turn, §13.6)."""
        item = sealed.item
        previous = self.items.add(item)
        announce(self._emit, previous, item)
        record = CommitRecord(session_id=self.id, turn_id=self.turn_id, epoch=self.responses.epoch,
                              history_len=len(self.items.conversation.items),
                              deferred=self.responses.active is not None and not flags, flags=flags)
        self._emit(audio_buffer_committed(previous_item_id=previous, item_id=item.id, record=record))
        if self.config.transcription and item.stream is not None:  # the model transcribes the turn
            self.transcriber.start(item, sealed.samples / MODEL_RATE, dict(self.config.transcription))
        elif item.transcript:  # the client's own transcript hints (appends' `transcript`)
            self._emit(input_transcription_completed(item_id=item.id, transcript=item.transcript,
                                                     audio_seconds=sealed.samples / MODEL_RATE))
        self._emit(item_done(previous_item_id=previous, item=item.to_wire()))
        self.turn_id += 1
        self.responses.unanswered = True

    # End --------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop everything this session started (no cancelled response.done is sent)."""
        self.input.close()
        await self.transcriber.close()
        await self.responses.close()
        self.items.clear()  # what the session holds goes with it
        self.input.clear()
