"""A duplex-lane session (docs/realtime-api.md §13) for a turn-based model such as Qwen3-Omni.

It takes the turn session's parts as they are (input keeps streaming while an answer plays,
server VAD, barge-in and deferral by overlap policy, playback acks) and differs where the
duplex lane does: it is opened by its first `session.update` (or by autostart) instead of at
accept, it starts with 16 kHz input and no turn detection, `interrupt_response` defaults to
true, updates are atomic, some fields are fixed at open, and it always speaks the [EXT]
surface in the duplex lane's spelling of error codes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from vllm_omni.audio.formats import AudioFormat
from vllm_omni.audio.pcm import MODEL_RATE
from vllm_omni.engine.interface import EngineClient
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.duplex_view import duplex_view
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import overlap_decision, response_listen, session_updated, turn_event
from vllm_omni.protocol.server_event_types import SESSION_CREATED
from vllm_omni.protocol.server_events import event, new_id
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.protocol.session_update import SessionUpdateResult
from vllm_omni.protocol.states import Lane
from vllm_omni.session.base import Emit, SessionOptions
from vllm_omni.session.conversation import Item
from vllm_omni.session.input_track import SealedTurn
from vllm_omni.session.overlap import decide, sounds_like_speech
from vllm_omni.session.turn_session import TurnSession

DUPLEX_INPUT = AudioFormat("pcm16", MODEL_RATE)  # the duplex lane's default input (§13.2)
REF_AUDIO_PATHS = ("ref_audio_path", "tts_ref_audio_path")
OPEN_TIME_ONLY = ("idle_timeout_s",)  # read when the session opens; later values are ignored
MAX_PENDING_TURNS = 4  # committed user turns waiting for an answer (§13.2, max_pending_turns_per_session)
KEPT_CODES = ("model_not_found",)  # opening failures reported under their own code
# turn.signal events run as these client events (docs/realtime-api.md §13.9) ...
SIGNAL_COMMANDS = frozenset({"input.cancel", "barge_in", "response.cancel", "output_audio_buffer.clear",
                             "session.update", "conversation.item.create", "conversation.item.delete",
                             "conversation.item.truncate", "conversation.item.retrieve"})
# ... and these set the turn state; any other is answered without changing it
SIGNAL_STATES = {"user_started": "user_speaking", "user_speaking": "user_speaking",
                 "user_committed": "user_committed", "assistant_started": "assistant_generating",
                 "assistant_done": "assistant_playing", "playback_ack": "idle", "timeout": "idle", "close": "idle"}


class DuplexSession(TurnSession):
    lane = Lane.DUPLEX
    mode = "duplex"
    capability_kind = "turn_based_duplex"

    def __init__(self, engine: EngineClient, config: SessionConfig, options: SessionOptions, emit: Emit):
        super().__init__(engine, config, options, emit)
        self._handlers["input_audio_buffer.append"] = self._append
        self._handlers["response.create"] = self._create_response
        self._handlers["turn.signal"] = self._turn_signal
        self.overlap_speech_ms = 0  # speech that arrived while an answer generated, now in the buffer

    # Input while an answer generates (docs/realtime-api.md §13.6) ------------------------------

    def _append(self, ev: ce.InputAudioBufferAppend) -> None:
        """Without server VAD, an append that does not sound like speech while no answer is in
        progress is not kept: `response.listen` says so (docs/realtime-api.md §13.6)."""
        samples = self.input.decode(ev, self.config.input_format)
        if self.responses.active is None and not self.input.detecting \
                and not sounds_like_speech(ev, samples, self.config.overlap_silence_rms):
            self.input.skip(samples)
            self._emit(self._listen("silence_or_noise"))
            return
        self._hold(ev, samples)

    def _hold(self, ev: ce.InputAudioBufferAppend, samples: np.ndarray) -> None:
        """Keep an append's samples for the next turn, or not, by the overlap policy."""
        if self.responses.active is None:
            self._take(ev, samples)
            return
        policy = self.config.overlap_policy
        decision = decide(ev, samples, policy=policy, vad_on=self.input.detecting,
                          silence_rms=self.config.overlap_silence_rms)
        if decision is None:  # server VAD decides (TurnSession._speech_started)
            self._take(ev, samples)
            return
        duration_ms = samples.size // 16
        self._emit(overlap_decision(session_id=self.id, epoch=self.responses.epoch, policy=policy,
                                    action=decision.action, reason=decision.reason,
                                    metadata={"duration_ms": duration_ms, "buffer_audio": decision.keep}))
        if decision.action == "barge_in":
            self._barge_in("barge_in")
        elif decision.keep:
            self.overlap_speech_ms += duration_ms
        if decision.keep:
            self._take(ev, samples)

    def _take(self, ev: ce.InputAudioBufferAppend, samples: np.ndarray) -> None:
        """Keep an append's samples for the turn (docs/realtime-api.md §13.6)."""
        self._place(ev, samples, self.input.take)

    def _heard(self, ev: ce.InputAudioBufferAppend, samples: np.ndarray) -> None:
        """An append the model took as it came (not kept here): on the timeline only."""
        self._place(ev, samples, self.input.heard)

    def _place(self, ev: ce.InputAudioBufferAppend, samples: np.ndarray,
               put: Callable[[ce.InputAudioBufferAppend, np.ndarray], None]) -> None:
        """`put` the samples; without server VAD the first append that sounds like speech opens
        a speech segment where it starts."""
        start, speech = self.input.timeline, self._opens_speech(ev, samples)
        put(ev, samples)
        if speech:
            self.input.open_heuristic_segment(ev, start)

    def _opens_speech(self, ev: ce.InputAudioBufferAppend, samples: np.ndarray) -> bool:
        return not self.input.detecting and self.input.segment_item is None \
            and sounds_like_speech(ev, samples, self.config.overlap_silence_rms)

    def _commit_input(self, ev: ce.InputAudioBufferCommit) -> None:
        if self.input.pending.size == 0 and (self.input.skipped_silence or ev.is_speech is False):
            self._silent_commit()
            return
        if self.responses.active is not None and 0 < self.overlap_speech_ms <= self.config.overlap_short_ack_ms:
            item_id = self.input.close_speech() or new_id("item_")
            self.input.clear()
            self._back_channel(SealedTurn(Item(id=item_id, role="user"), 0))
            return
        pending = self._pending_turns()
        if pending >= MAX_PENDING_TURNS:
            raise ProtocolError("input_backpressure", f"{pending} committed turns are waiting for an answer; at most "
                                f"{MAX_PENDING_TURNS} may wait (the buffer is kept): send response.create first")
        self.overlap_speech_ms = 0
        super()._commit_input(ev)

    def _pending_turns(self) -> int:
        """Spoken user turns committed after the conversation's last answer."""
        pending = 0
        for item in reversed(self.items.conversation.items):
            if item.role == "assistant":
                break
            pending += item.role == "user" and item.audio_ms > 0
        return pending

    async def _create_response(self, ev: ce.ResponseCreate) -> None:
        """A duplex response answers new input: committed audio, or user items (§13.2)."""
        if ev.response.input is None and self.responses.active is None and not self.responses.unanswered:
            raise ProtocolError("response_create_without_input", "response.create requires committed audio (or a "
                                "new user item) to answer")
        await self.responses.create(ev)

    def _server_commit(self, sealed: SealedTurn) -> None:
        td = self.config.turn_detection
        speech_ms = sealed.samples / 16 - td.prefix_padding_ms - td.silence_duration_ms
        if self.responses.active is not None and speech_ms <= self.config.overlap_short_ack_ms:
            sealed.item.stream, sealed.item.audio_ms = None, 0
            self._back_channel(sealed)
            return
        super()._server_commit(sealed)

    def _back_channel(self, sealed: SealedTurn) -> None:
        """Short speech over an answer ("mm-hm"): an empty turn that is not answered."""
        self.overlap_speech_ms = 0
        self._empty_turn(sealed, ("empty", "overlap_ack", "no_response"))

    def _silent_commit(self) -> None:
        """A commit of only non-speech (or `is_speech:false` with nothing pending): an empty
        turn that is not answered, whatever the commit asked, then `response.listen`
        (docs/realtime-api.md §13.6)."""
        self.input.clear()
        self._empty_turn(SealedTurn(Item(id=new_id("item_"), role="user", is_speech=False), 0),
                         ("empty", "not_is_speech", "no_response"))
        self._emit(self._listen("silence_or_noise"))

    def _empty_turn(self, sealed: SealedTurn, flags: tuple[str, ...]) -> None:
        unanswered = self.responses.unanswered
        self._commit(sealed, flags=flags)
        self.responses.unanswered = unanswered  # nothing new to answer

    def _listen(self, reason: str, response_id: str | None = None) -> dict[str, Any]:
        return response_listen(session_id=self.id, epoch=self.responses.epoch, reason=reason,
                               response_id=response_id)

    async def _turn_signal(self, ev: ce.TurnSignal) -> None:
        """turn.signal (docs/realtime-api.md §13.9): a command by name, run with `payload` as its
        body (errors name this event's id), or a turn-state change answered with turn.event."""
        if ev.event is None:
            raise ProtocolError("bad_event", "turn.signal requires event", "event")
        if ev.event in SIGNAL_COMMANDS:
            body = {**(ev.payload or {}), "type": ev.event}
            await self._dispatch(ce.parse_client_event(body))
            return
        self.turn_state = SIGNAL_STATES.get(ev.event, self.turn_state)
        self._emit(turn_event(session_id=self.id, event_name=ev.event, epoch=self.responses.epoch,
                              turn_state="assistant_generating" if self.responses.active else self.turn_state))

    def _session_update(self, update: dict[str, Any]) -> SessionUpdateResult:
        """Atomic, as the duplex lane's updates are: the first problem refuses it all (§13.2)."""
        _check_model_fields(update)
        if "ref_audio" in update:
            raise ProtocolError("ref_audio_update_unsupported", "ref_audio can only be set when the session opens",
                                "ref_audio")
        result = super()._session_update({k: v for k, v in update.items() if k not in OPEN_TIME_ONLY})
        if result.rejected:
            raise result.rejected[0]
        voice = result.config.voice
        if voice is not None and voice != self.config.voice and self.responses.spoke:  # fixed once spoken (§13.2)
            raise ProtocolError("voice_update_after_audio_unsupported", "the voice cannot change once the session "
                                "has produced audio", "voice")
        return result

    def configure_opening(self, opening: dict[str, Any]) -> None:
        """The opening session object, open-time fields included; any problem refuses the open."""
        self._check_opening(opening)
        result = super()._session_update(opening)
        if result.rejected:
            problem = result.rejected[0]
            if problem.code in KEPT_CODES:
                raise problem
            raise ProtocolError("invalid_session_config", f"{problem.code}: {problem.message}", problem.param)
        self.config = result.config
        self.input.configure(self.config.turn_detection)

    def _check_opening(self, opening: dict[str, Any]) -> None:
        if opening.get("ref_audio") is not None:
            raise ProtocolError("invalid_duplex_runtime_config", "this model takes no ref_audio (it has no voice "
                                "cloning); choose a voice", "ref_audio")

    def opened(self) -> None:
        """session.created and session.updated are out: the session may start its work."""


def _check_model_fields(opening: dict[str, Any]) -> None:
    """What no duplex model takes (voice prompts come as `ref_audio` data)."""
    for key in REF_AUDIO_PATHS:
        if key in opening:
            raise ProtocolError("unsupported_ref_audio_path", f"{key} is not supported; send ref_audio", key)


def open_duplex_session(engine: EngineClient, options: SessionOptions, opening: dict[str, Any],
                        model: str, emit: Emit, *, session_id: str | None = None,
                        created_fields: Mapping[str, Any] | None = None,
                        kind: type[DuplexSession] = DuplexSession) -> DuplexSession:
    """A session of `kind` opened with the `opening` session object (docs/realtime-api.md §13.1):
    session.created, then session.updated with the same object. Raises ProtocolError (the
    connection then ends) when the object cannot open one: `model_not_found`, or
    `invalid_session_config` naming the problem."""
    _check_model_fields(opening)
    model = opening.get("model") or model
    if model not in options.served_models:
        raise ProtocolError("model_not_found", f"The model `{str(model)[:200]}` does not exist.", "model")

    def duplex_emit(server_event: dict[str, Any]) -> None:
        emit(duplex_view(server_event, epoch=session.responses.epoch))

    config = SessionConfig(id=session_id or new_id("duplex-"), model=model, input_format=DUPLEX_INPUT)
    session = kind(engine, config, options, duplex_emit)
    session.configure_opening(opening)
    # resume credentials (attachment_generation, resume_token) ride on session.created only
    duplex_emit(event(SESSION_CREATED, session=session.session_object(), **(created_fields or {})))
    duplex_emit(session_updated(session=session.session_object()))
    session.opened()
    return session
