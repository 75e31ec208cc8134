"""What every realtime session has, whatever its lane and however its input reaches the model:
the configuration, the conversation's items, the responses, the input track and the
transcriber, the commit fan-out of a user turn, and the client events that mean the same on
every lane (items, response cancel, playback, heartbeats).

A session (session/session.py) is this core, a lane part (session/lanes.py) and an input
policy (session/turn_input.py, session/overlap_input.py, session/unit_input.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from vllm_omni.audio.pcm import MODEL_RATE
from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.request import OmniRequest
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import (
    CommitRecord,
    audio_buffer_committed,
    heartbeat_ack,
    input_transcription_completed,
    item_done,
    response_listen,
)
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.session.base import Emit, SessionOptions
from vllm_omni.session.conversation import announce
from vllm_omni.session.input_track import InputTrack, SealedTurn
from vllm_omni.session.item_store import ItemStore
from vllm_omni.session.response import ResponseRun
from vllm_omni.session.response_controller import ResponseController
from vllm_omni.session.transcriber import Transcriber

Handler = Callable[[Any], Awaitable[None] | None]
Handlers = dict[str, Handler]


class InputHooks(Protocol):
    """What the core's parts report to the session's input policy."""

    def speech_started(self) -> None:
        """Server VAD heard the user start speaking."""

    def server_commit(self, sealed: SealedTurn) -> None:
        """Server VAD (or the end-of-turn model) ended a user turn."""

    def produce(self, run: ResponseRun, request: OmniRequest, previous_item_id: str | None) -> None:
        """Start producing a response the controller created."""

    def response_cancelled(self) -> None:
        """The active response was cancelled (a client cancel, an output clear or a barge-in)."""


class SessionCore:
    def __init__(self, engine: EngineClient, config: SessionConfig, options: SessionOptions, emit: Emit,
                 hooks: InputHooks):
        self.engine = engine
        self.config = config
        self.options = options
        self.emit = emit
        self.turn_id = 0  # user turns committed
        self.turn_state = "idle"  # while no response generates (a duplex client's turn.signal sets it)
        self.input = InputTrack(engine, emit, vad_model_path=options.vad_model_path,
                                end_of_turn_model_path=options.end_of_turn_model_path,
                                on_speech_started=hooks.speech_started, on_server_commit=hooks.server_commit,
                                busy=lambda: self.responses.active is not None)
        self.items = ItemStore(engine, emit, session_id=config.id,
                               max_history_audio_ms=int(options.max_history_audio_s * 1000),
                               input_format=lambda: self.config.input_format)
        self.responses = ResponseController(
            engine, emit, conversation=self.items.conversation, config=lambda: self.config,
            default_speaker=options.default_speaker, resolve_input=self.items.response_input,
            produce=hooks.produce, on_cancelled=hooks.response_cancelled,
            on_started=self.input.disarm_idle_timer,
            on_completed=lambda run: self.input.arm_idle_timer(run.item.audio_duration_ms))
        self.transcriber = Transcriber(engine, emit, config.id, answer_audio=lambda: (
            self.responses.active.audio_started if self.responses.active is not None else None))
        self.input.configure(config.turn_detection)

    @property
    def id(self) -> str:
        return self.config.id

    def handlers(self) -> Handlers:
        """The client events every session applies the same way (session.update is the lane's,
        the input events and response.create the input policy's)."""
        return {
            "input.text.append": self._append_text,
            "conversation.item.create": self._create_item,
            "conversation.item.delete": self.items.delete,
            "conversation.item.retrieve": self.items.retrieve,
            "conversation.item.truncate": lambda ev: self.responses.truncated(*self.items.truncate(ev)),
            "response.cancel": self.responses.cancel,
            "output_audio_buffer.clear": self.responses.clear_output,
            "playback.ack": self.responses.playback_ack,
            "session.heartbeat": lambda ev: self.emit(heartbeat_ack(session_id=self.id)),
        }

    def state(self) -> dict[str, Any]:
        """The session object's live fields (docs/realtime-api.md §2.1), capabilities aside."""
        active = self.responses.active
        return {"state": "open", "turn_state": "assistant_generating" if active else self.turn_state,
                "epoch": self.responses.epoch, "turn_id": self.turn_id,
                "active_request_id": active.request_id if active else None,
                "active_response_id": active.id if active else None, "active_response_turn_id": None,
                "playback": dict(active.playback) if active else
                {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0}}

    def adopt(self, config: SessionConfig) -> None:
        """`config` becomes the session's (turn detection rebuilt if it changed)."""
        before, self.config = self.config.turn_detection, config
        if self.config.turn_detection != before:
            self.input.configure(self.config.turn_detection)

    # User turns -------------------------------------------------------------------------------

    def commit(self, sealed: SealedTurn, flags: tuple[str, ...] = ()) -> None:
        """The commit fan-out of a sealed user turn (docs/realtime-api.md §6.0 C(X)); `flags`
        mark the committed record (an empty back-channel turn, §13.6)."""
        item = sealed.item
        previous = self.items.add(item)
        announce(self.emit, previous, item)
        record = CommitRecord(session_id=self.id, turn_id=self.turn_id, epoch=self.responses.epoch,
                              history_len=len(self.items.conversation.items),
                              deferred=self.responses.active is not None and not flags, flags=flags)
        self.emit(audio_buffer_committed(previous_item_id=previous, item_id=item.id, record=record))
        if self.config.transcription and item.stream is not None:  # the model transcribes the turn
            self.transcriber.start(item, sealed.samples / MODEL_RATE, dict(self.config.transcription))
        elif item.transcript:  # the client's own transcript hints (appends' `transcript`)
            self.emit(input_transcription_completed(item_id=item.id, transcript=item.transcript,
                                                    audio_seconds=sealed.samples / MODEL_RATE))
        self.emit(item_done(previous_item_id=previous, item=item.to_wire()))
        self.turn_id += 1
        self.responses.unanswered = True

    def empty_turn(self, sealed: SealedTurn, flags: tuple[str, ...],
                   commit: Callable[[SealedTurn, tuple[str, ...]], None]) -> None:
        """A user turn recorded but not to be answered (`commit`: the policy's fan-out)."""
        unanswered = self.responses.unanswered
        commit(sealed, flags)
        self.responses.unanswered = unanswered  # nothing new to answer

    def barge_in(self, reason: str) -> bool:
        """The user interrupts: the active response is cancelled (False: none was active)."""
        return self.responses.cancel_active(reason)

    def listen(self, reason: str, response_id: str | None = None) -> dict[str, Any]:
        """`response.listen` (the duplex lane's, docs/realtime-api.md §13.6, §13.7)."""
        return response_listen(session_id=self.id, epoch=self.responses.epoch, reason=reason,
                               response_id=response_id)

    # Handlers ---------------------------------------------------------------------------------

    def _append_text(self, ev: ce.InputTextAppend) -> None:
        if not isinstance(ev.text, str):
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'text'.", "text")
        raise ProtocolError("native_text_append_unsupported", "send text as a conversation.item.create user message")

    async def _create_item(self, ev: ce.ConversationItemCreate) -> None:
        item = await self.items.create(ev)
        if item.role in ("user", "tool"):
            self.responses.unanswered = True

    # End --------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop everything the parts started (no cancelled response.done is sent)."""
        self.input.close()
        await self.transcriber.close()
        await self.responses.close()
        self.items.clear()  # what the session holds goes with it
        self.input.clear()
