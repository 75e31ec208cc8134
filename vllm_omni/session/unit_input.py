"""Unit input: a natively duplex model hears the input unit by unit and decides itself, per unit,
whether to listen or to speak (docs/realtime-api.md §13.7; MiniCPM-o 4.5).

`UnitInput` is the policy: the model's feeder and an intake. With `auto_response`
(ContinuousIntake) every append goes, in arrival order, to the model; each unit it decides
becomes `response.listen` or a delta of the response its speaking turn opened. A
commit-driven session (CommitIntake) holds the audio as turn input on the duplex lane does;
a commit hands the turn to the model, which hears it without answering, and a response
feeds the model silence units until it has spoken its turn. Either way the user item keeps
the turn's length, not its audio: the model has it, in a context that is kept, never re-read.
"""

from __future__ import annotations

from typing import Any

from vllm_omni.engine.interface import UnitEngine
from vllm_omni.engine.native_duplex import DuplexOpening
from vllm_omni.engine.request import OmniRequest
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.images import frames_from_append
from vllm_omni.protocol.server_event_builders import overlap_decision
from vllm_omni.protocol.server_events import new_id
from vllm_omni.session.capabilities import capabilities
from vllm_omni.session.conversation import Item
from vllm_omni.session.core import Handlers, SessionCore
from vllm_omni.session.input_track import MAX_PENDING_INPUT_BYTES, MIN_TURN_SAMPLES, SealedTurn, commit_too_small
from vllm_omni.session.native_opening import check_model_update, check_response_options, check_server_owned
from vllm_omni.session.native_response import no_spoken_turn, pending_user_input
from vllm_omni.session.overlap import decide_native, sounds_like_speech
from vllm_omni.session.overlap_input import SILENT_TURN, OverlapTurnInput, place
from vllm_omni.session.response import ResponseRun
from vllm_omni.session.turn_input import TurnInput
from vllm_omni.session.unit_feeder import Append, UnitFeeder

COMMIT_CONTINUATION_LIMIT = 8  # silence units a commit-driven response may be fed (docs/realtime-api.md §13.7)


class UnitInput:
    """The input policy of a natively duplex model (session/session.py InputPolicy)."""

    mode = "native_duplex"

    def __init__(self, core: SessionCore, native: UnitEngine, auto_response: bool):
        self.core = core
        self._native = native
        limit = core.options.native_duplex.continuation_limit_units
        self.feeder = UnitFeeder(core, native, limit if auto_response else min(limit, COMMIT_CONTINUATION_LIMIT))
        self.intake = ContinuousIntake(core, self.feeder) if auto_response else CommitIntake(core, self.feeder)

    def handlers(self) -> Handlers:
        return self.intake.handlers()

    def capabilities(self) -> dict[str, Any]:
        """The natively duplex column, with the model's own unit grid."""
        return {**capabilities("model_native_duplex", max_sessions=self.core.options.max_sessions),
                "chunk_period_ms": self._native.unit_ms, "first_chunk_ms": self._native.first_unit_ms}

    def check_update(self, update: dict[str, Any]) -> None:
        """What only the opening may set: the model's context is kept, never re-read."""
        if "instructions" in update:
            raise ProtocolError("instructions_update_unsupported", "instructions are part of the model's context: "
                                "they can only be set when the session opens", "instructions")
        extra = update.get("extra_body") or {}
        if isinstance(extra, dict):
            check_server_owned(extra)
        check_model_update(update, self._native)

    def start(self, opening: DuplexOpening) -> None:
        """Open the model's stream (session.created and session.updated are out)."""
        self.feeder.start(opening)

    # What the core reports --------------------------------------------------------------------

    def speech_started(self) -> None:
        self.intake.speech_started()

    def server_commit(self, sealed: SealedTurn) -> None:
        self.intake.server_commit(sealed)

    def produce(self, run: ResponseRun, request: OmniRequest, previous_item_id: str | None) -> None:
        """A response the controller created: announced, then fed by the model's next turn (the
        request is the engine's; the model answers in its own context)."""
        run.open(previous_item_id)
        self.feeder.answer(run)

    def response_cancelled(self) -> None:
        self.feeder.model_turn_cancelled()

    async def close(self) -> None:
        await self.feeder.close()


class ContinuousIntake:
    """auto_response: the model hears all input as it arrives and owns when it answers."""

    def __init__(self, core: SessionCore, feeder: UnitFeeder):
        self.core, self.feeder = core, feeder
        self.turn = TurnInput(core, commit=self._commit)
        self._uncommitted = 0  # samples since the last commit (kept as a count: the model has heard them)
        self._speech_since_commit = False  # else a commit only records an empty turn

    def handlers(self) -> Handlers:
        return {**self.turn.handlers(), "input_audio_buffer.append": self._append,
                "input_audio_buffer.commit": self._commit_input, "input_audio_buffer.clear": self._clear_input,
                "response.create": self._create_response}

    def _append(self, ev: ce.InputAudioBufferAppend) -> None:
        """Any chunk size goes, up to the pending-input cap: the feeder hands the model whole
        units however the audio arrived."""
        core = self.core
        frames = frames_from_append(ev.video_frames, ev.max_slice_nums)
        if not ev.payload:
            if frames:
                raise ProtocolError("invalid_input_modality", "this model needs audio with every append; frames "
                                    "ride the append that closes their unit", "audio")
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'audio'.", "audio")
        samples = core.input.decode(ev.model_copy(update={"video_frames": None}), core.config.input_format)
        if self.feeder.pending_bytes + samples.nbytes > MAX_PENDING_INPUT_BYTES:
            raise ProtocolError("input_backpressure", f"more than {MAX_PENDING_INPUT_BYTES >> 20} MiB of input "
                                "audio would wait for the model; send audio at real-time pace")
        if core.responses.active is not None:
            decision = decide_native(ev, samples, policy=core.config.overlap_policy,
                                     silence_rms=core.config.overlap_silence_rms)
            core.emit(overlap_decision(session_id=core.id, epoch=core.responses.epoch,
                                       policy=core.config.overlap_policy, action=decision.action,
                                       reason=decision.reason, metadata={"duration_ms": samples.size // 16,
                                                                         "buffer_audio": True}))
            if decision.action == "barge_in":
                core.barge_in("barge_in")
        force_listen = bool(ev.force_listen)
        if core.input.detecting:  # server VAD needs the samples (it keeps only what a turn can need)
            core.input.take(ev, samples)
            force_listen = force_listen or core.input.segment_item is not None  # the user speaks: the model listens
        else:
            self._uncommitted += samples.size
            place(core.input, ev, samples, core.input.heard, core.config.overlap_silence_rms)
        self._speech_since_commit = self._speech_since_commit or core.input.segment_item is not None \
            or sounds_like_speech(ev, samples, core.config.overlap_silence_rms)
        self.feeder.cancel_silence()
        self.feeder.put(Append(samples, frames, force_listen))

    def _commit_input(self, ev: ce.InputAudioBufferCommit) -> None:
        """The input so far becomes a user item; a residual shorter than a unit is padded with
        silence to the unit's end, so the model decides it now. Without speech since the last
        commit (or with `is_speech: false`) the turn is empty and nothing goes to the model."""
        core = self.core
        if core.input.detecting:
            sealed = core.input.commit()
        else:
            if self._uncommitted < MIN_TURN_SAMPLES:
                raise commit_too_small(self._uncommitted)
            sealed = SealedTurn(Item(id=core.input.close_speech() or new_id("item_"), role="user",
                                     audio_ms=self._uncommitted // 16), self._uncommitted)
            self._uncommitted = 0
        speech, self._speech_since_commit = self._speech_since_commit and ev.is_speech is not False, False
        if not speech:
            sealed.item.stream, sealed.item.audio_ms, sealed.item.is_speech = None, 0, False
            core.empty_turn(sealed, SILENT_TURN, self._commit)
            core.emit(core.listen("silence_or_noise"))
            return
        self._commit(sealed, ())
        self.feeder.put(Append.marker("commit"))

    def _clear_input(self, ev: ce.ClientEvent) -> None:
        self._uncommitted = 0
        self.turn.clear_input(ev)

    async def _create_response(self, ev: ce.ResponseCreate) -> None:
        raise no_spoken_turn(pending_user_input(self.core.items.conversation.items)[1])

    def _commit(self, sealed: SealedTurn, flags: tuple[str, ...]) -> None:
        """Into the history only: the model has heard the audio already."""
        sealed.item.stream = None
        self.core.commit(sealed, flags)

    # What the core reports --------------------------------------------------------------------

    def speech_started(self) -> None:
        self.turn.speech_started()

    def server_commit(self, sealed: SealedTurn) -> None:
        """Server VAD ends the user's turn in the history only: the model owns when it answers."""
        self._commit(sealed, ())


class CommitIntake:
    """Without auto_response: turn input whose commits and responses drive the model."""

    def __init__(self, core: SessionCore, feeder: UnitFeeder):
        self.core, self.feeder = core, feeder
        self.overlap = OverlapTurnInput(core, commit=self._commit)

    def handlers(self) -> Handlers:
        return {**self.overlap.handlers(), "input_audio_buffer.append": self._append,
                "response.create": self._create_response}

    def _append(self, ev: ce.InputAudioBufferAppend) -> None:
        """Held as turn input on the duplex lane holds it (idle silence is not kept)."""
        if ev.video_frames:
            raise ProtocolError("invalid_input_modality", "frames need an auto_response session: they bind to the "
                                "units the model hears as the audio arrives", "video_frames")
        self.overlap.append(ev)

    async def _create_response(self, ev: ce.ResponseCreate) -> None:
        check_response_options(ev.response)
        spoken, typed = pending_user_input(self.core.items.conversation.items)
        if typed and not spoken and self.core.responses.active is None:
            raise no_spoken_turn(typed)
        await self.overlap.create_response(ev)

    def _commit(self, sealed: SealedTurn, flags: tuple[str, ...]) -> None:
        """The turn goes to the model here, to hear (its units listen), not to answer."""
        held, sealed.item.stream = sealed.item.stream, None
        self.core.commit(sealed, flags)
        if held is not None:
            self.feeder.put(Append(held.close(), force_listen=True))
            self.feeder.put(Append.marker("commit", force_listen=True))

    # What the core reports --------------------------------------------------------------------

    def speech_started(self) -> None:
        self.overlap.speech_started()

    def server_commit(self, sealed: SealedTurn) -> None:
        self.overlap.server_commit(sealed)
