"""A native duplex session (docs/realtime-api.md §13.7): the model hears the input unit by unit
and decides itself, per unit, whether to listen or to speak (MiniCPM-o 4.5).

It keeps the duplex lane's parts (opening, atomic updates, items, the playback ledger, resume)
and replaces how input reaches the model and how responses start. With `auto_response` every
append goes, in arrival order, to the session's model stream; each unit the model decides
becomes `response.listen`, or a delta of the response its speaking turn opened
(`response.speak` first). A commit-driven session (without it) holds the audio as a turn-based
duplex session does; a commit hands the turn to the model, which hears it without answering,
and a response (`response.create`, `create_response`) feeds the model silence units until it
has spoken its turn. While the model speaks and no input arrives, silence units keep it
going, up to a limit. A barge-in cancels the response and makes the next unit listen, which
closes the model's turn in its context: the context is kept, never re-read.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.native_duplex import (
    DuplexOpening,
    NativeDuplexEngine,
    NativeDuplexStream,
    UnitDecision,
)
from vllm_omni.engine.request import AudioChunk
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.images import frames_from_append
from vllm_omni.protocol.server_event_builders import overlap_decision, response_speak
from vllm_omni.protocol.server_events import error_event, new_id
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.protocol.session_update import SessionUpdateResult
from vllm_omni.session.base import Emit, SessionOptions
from vllm_omni.session.capabilities import capabilities
from vllm_omni.session.conversation import Item
from vllm_omni.session.duplex_session import DuplexSession
from vllm_omni.session.input_track import MAX_PENDING_INPUT_BYTES, MIN_TURN_SAMPLES, SealedTurn, commit_too_small
from vllm_omni.session.native_opening import (
    WINDOW_KEYS,
    check_response_options,
    check_server_owned,
    native_opening,
    native_settings,
)
from vllm_omni.session.native_response import ResponseTokenClock, no_spoken_turn, pending_user_input
from vllm_omni.session.native_units import Piece, Unit, UnitAssembler
from vllm_omni.session.overlap import decide_native, sounds_like_speech
from vllm_omni.session.response import ResponseRun

logger = logging.getLogger(__name__)

COMMIT_CONTINUATION_LIMIT = 8  # silence units a commit-driven response may be fed (docs/realtime-api.md §13.7)


@dataclass
class _Append:
    samples: np.ndarray
    frames: list[bytes] = field(default_factory=list)
    force_listen: bool = False  # every unit this append closes listens
    kind: Literal["input", "commit", "silence", "last_silence", "answer"] = "input"  # else: pad to the unit's end
    answer: ResponseRun | None = None  # kind "answer": the response the model's next turn feeds


class NativeDuplexSession(DuplexSession):
    mode = "native_duplex"

    def __init__(self, engine: EngineClient, config: SessionConfig, options: SessionOptions, emit: Emit):
        super().__init__(engine, config, options, emit)
        if engine.native_duplex is None:
            raise TypeError("a native duplex session needs an engine with native_duplex")
        self.native: NativeDuplexEngine = engine.native_duplex
        self._handlers["input_audio_buffer.append"] = self._append_native
        self._handlers["input_audio_buffer.commit"] = self._commit_native
        self._handlers["response.create"] = self._create_native
        self._handlers["response.cancel"] = self._cancel_native
        self._handlers["output_audio_buffer.clear"] = self._clear_output_native
        self._stream: NativeDuplexStream | None = None
        self._appends: asyncio.Queue[_Append | None] = asyncio.Queue()
        self._feeder: asyncio.Task | None = None
        self._speaking: ResponseRun | None = None  # the response the model's current turn feeds
        self._voiced = False  # the model has begun speaking into it (response.speak sent)
        self._closing_turn = False  # after a barge-in: units listen until the model's turn has closed
        self._silence_timer: asyncio.TimerHandle | None = None
        self._silence_units = 0  # fed into the current response
        self._model_opening: DuplexOpening | None = None
        self._uncommitted = 0  # samples since the last commit (kept as a count: the model has heard them)
        self._speech_since_commit = False  # else a commit only records an empty turn (docs/realtime-api.md §13.7)
        self._unit = UnitAssembler()  # the model gets each unit whole
        self._pending_bytes = 0  # input samples not yet handed to the model (queued or in `_unit`)
        self._clock = ResponseTokenClock()  # stage 0's metrics of the response the model speaks

    # Opening ----------------------------------------------------------------------------------

    def _check_opening(self, opening: dict[str, Any]) -> None:
        """The model-facing fields, kept for `opened` (the audio modality is checked after the
        opening applies, as it may set it)."""
        self._settings = native_settings(opening, self.options)

    def configure_opening(self, opening: dict[str, Any]) -> None:
        super().configure_opening(opening)
        self._model_opening = native_opening(opening, self.config.wants_audio, self._settings)
        if not self._settings.auto_response:  # commit-driven: input and responses as a duplex session's
            self._handlers["input_audio_buffer.append"] = self._append_held
            self._handlers["input_audio_buffer.commit"] = self._commit_input
            self._handlers["response.create"] = self._create_commit_driven
            self.responses.feed_answer = self._answer

    def opened(self) -> None:
        """Open the model's stream: its context prefill runs first in the feeder, ahead of any input."""
        self._feeder = asyncio.create_task(self._feed(self._model_opening), name=f"native-duplex-{self.id}")

    def capabilities(self) -> dict[str, Any]:
        return capabilities("model_native_duplex", max_sessions=self.options.max_sessions)

    def _session_update(self, update: dict[str, Any]) -> SessionUpdateResult:
        if "instructions" in update:
            raise ProtocolError("instructions_update_unsupported", "instructions are part of the model's context: "
                                "they can only be set when the session opens", "instructions")
        extra = update.get("extra_body") or {}
        if isinstance(extra, dict):
            check_server_owned(extra)
        window = next((key for key in WINDOW_KEYS if key in update or key in extra), None)
        if window is not None:
            raise ProtocolError("sliding_window_update_unsupported", f"{window} can only be set when the session "
                                "opens", window)
        return super()._session_update(update)

    # Input ------------------------------------------------------------------------------------

    def _append_native(self, ev: ce.InputAudioBufferAppend) -> None:
        """Any chunk size goes, up to the pending-input cap (docs/realtime-api.md §13.7): the
        feeder hands the model whole units however the audio arrived."""
        frames = frames_from_append(ev.video_frames, ev.max_slice_nums)
        if not ev.payload:
            if frames:
                raise ProtocolError("invalid_input_modality", "this model needs audio with every append; frames "
                                    "ride the append that closes their unit", "audio")
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'audio'.", "audio")
        samples = self.input.decode(ev.model_copy(update={"video_frames": None}), self.config.input_format)
        if self._pending_bytes + samples.nbytes > MAX_PENDING_INPUT_BYTES:
            raise ProtocolError("input_backpressure", f"more than {MAX_PENDING_INPUT_BYTES >> 20} MiB of input "
                                "audio would wait for the model; send audio at real-time pace")
        if self.responses.active is not None:
            decision = decide_native(ev, samples, policy=self.config.overlap_policy,
                                     silence_rms=self.config.overlap_silence_rms)
            self._emit(overlap_decision(session_id=self.id, epoch=self.responses.epoch,
                                        policy=self.config.overlap_policy, action=decision.action,
                                        reason=decision.reason, metadata={"duration_ms": samples.size // 16,
                                                                          "buffer_audio": True}))
            if decision.action == "barge_in":
                self._barge_in("barge_in")
        force_listen = bool(ev.force_listen)
        if self.input.detecting:  # server VAD needs the samples (it keeps only what a turn can need)
            self.input.take(ev, samples)
            force_listen = force_listen or self.input.segment_item is not None  # the user speaks: the model listens
        else:
            self._uncommitted += samples.size
            self._heard(ev, samples)
        self._speech_since_commit = self._speech_since_commit or self.input.segment_item is not None \
            or sounds_like_speech(ev, samples, self.config.overlap_silence_rms)
        self._cancel_silence()
        self._put_input(_Append(samples, frames, force_listen))

    def _put_input(self, append: _Append) -> None:
        self._pending_bytes += append.samples.nbytes
        self._appends.put_nowait(append)

    def _append_held(self, ev: ce.InputAudioBufferAppend) -> None:
        """A commit-driven session's append: as a duplex session's (idle silence is not kept)."""
        if ev.video_frames:
            raise ProtocolError("invalid_input_modality", "frames need an auto_response session: they bind to the "
                                "units the model hears as the audio arrives", "video_frames")
        self._append(ev)

    def _server_commit(self, sealed: SealedTurn) -> None:
        """With auto_response server VAD ends the user's turn in the history only: the model owns
        when it answers. A commit-driven session answers as its turn detection says."""
        if self._settings.auto_response:
            self._commit(sealed)
        else:
            super()._server_commit(sealed)

    def _commit(self, sealed: SealedTurn, flags: tuple[str, ...] = ()) -> None:
        """The user item keeps the turn's length, not its audio: the model has it. A commit-driven
        session hands the turn to the model here, to hear (its units listen), not to answer."""
        held, sealed.item.stream = sealed.item.stream, None
        super()._commit(sealed, flags)
        if not self._settings.auto_response and held is not None:
            self._put_input(_Append(held.close(), force_listen=True))
            self._appends.put_nowait(_Append(np.zeros(0, np.float32), force_listen=True, kind="commit"))

    def _answer(self, run: ResponseRun) -> None:
        """A commit-driven response: once the model has heard what came before, it gets silence
        units until it has spoken its turn (or the limit)."""
        self._appends.put_nowait(_Append(np.zeros(0, np.float32), kind="answer", answer=run))

    def _commit_native(self, ev: ce.InputAudioBufferCommit) -> None:
        """The input so far becomes a user item (its audio is the model's: the item records how
        long it was); a residual shorter than a unit is padded with silence to the unit's end,
        so the model decides it now. Without speech since the last commit (or with `is_speech:
        false`) the turn is empty and nothing goes to the model (docs/realtime-api.md §13.7)."""
        if self.input.detecting:
            sealed = self.input.commit()
        else:
            if self._uncommitted < MIN_TURN_SAMPLES:
                raise commit_too_small(self._uncommitted)
            sealed = SealedTurn(Item(id=self.input.close_speech() or new_id("item_"), role="user",
                                     audio_ms=self._uncommitted // 16), self._uncommitted)
            self._uncommitted = 0
        speech, self._speech_since_commit = self._speech_since_commit and ev.is_speech is not False, False
        if not speech:
            sealed.item.stream, sealed.item.audio_ms, sealed.item.is_speech = None, 0, False
            self._empty_turn(sealed, ("empty", "not_is_speech", "no_response"))
            self._emit(self._listen("silence_or_noise"))
            return
        self._commit(sealed)
        self._appends.put_nowait(_Append(np.zeros(0, np.float32), kind="commit"))

    def _clear_input(self, ev: ce.ClientEvent) -> None:
        self._uncommitted = 0
        super()._clear_input(ev)

    async def _create_commit_driven(self, ev: ce.ResponseCreate) -> None:
        check_response_options(ev.response)
        spoken, typed = pending_user_input(self.items.conversation.items)
        if typed and not spoken and self.responses.active is None:
            raise no_spoken_turn(typed)
        await self._create_response(ev)

    async def _create_native(self, ev: ce.ResponseCreate) -> None:
        raise no_spoken_turn(pending_user_input(self.items.conversation.items)[1])

    def _cancel_native(self, ev: ce.ResponseReference) -> None:
        before = self.responses.active
        self.responses.cancel(ev)
        if before is not None:
            self._model_turn_cancelled()

    def _clear_output_native(self, ev: ce.ResponseReference) -> None:
        before = self.responses.active
        self.responses.clear_output(ev)
        if before is not None and self.responses.active is None:
            self._model_turn_cancelled()

    def _barge_in(self, reason: str) -> bool:
        """Also the model's turn: its next units listen until the turn has closed in its context."""
        if not super()._barge_in(reason):
            return False
        self._model_turn_cancelled()
        return True

    def _model_turn_cancelled(self) -> None:
        """The response is gone; the model's next unit listens, which closes its turn."""
        self._speaking, self._voiced = None, False
        self._closing_turn = True
        self._cancel_silence()

    # The model --------------------------------------------------------------------------------

    async def _feed(self, opening: DuplexOpening) -> None:
        try:
            self._stream = await self.native.open_stream(opening)
        except Exception as exc:
            logger.exception("session %s: the model could not open", self.id)
            self._emit(error_event(ProtocolError("engine_error", f"the model could not start this session "
                                                 f"({type(exc).__name__}: {exc})")))
            return
        while True:
            item = await self._appends.get()
            if item is None:
                return
            if item.kind == "answer":
                if item.answer is self.responses.active:  # not cancelled meanwhile
                    self._speaking, self._voiced, self._silence_units = item.answer, False, 0
                    self._schedule_silence()
                continue
            if item.kind == "input":
                self._unit.add(Piece(item.samples, item.frames, item.force_listen))
            elif item.kind != "commit" or self._unit.samples:  # a commit right on a unit's end adds nothing
                self._unit.pad(self._stream.samples_to_boundary(), item.force_listen)
            while (unit := self._unit.take(self._stream.samples_to_boundary())) is not None:
                self._pending_bytes -= unit.samples.nbytes
                await self._decide_unit(unit, at_limit=item.kind == "last_silence")

    async def _decide_unit(self, unit: Unit, at_limit: bool) -> None:
        """One model call per unit, however the audio arrived (session/native_units.py)."""
        try:
            self._clock.submitting()
            decisions = await self._stream.append(unit.samples, frame_groups=unit.frame_groups,
                                                  force_listen=unit.force_listen or self._closing_turn)
            for decision in decisions:
                self._decided(decision, at_limit=at_limit)
        except Exception as exc:  # the session goes on: the next input gets the next units
            logger.exception("session %s: a unit failed", self.id)
            self._emit(error_event(ProtocolError("engine_error", f"the model failed on this input "
                                                 f"({type(exc).__name__}: {exc})")))

    def _decided(self, decision: UnitDecision, at_limit: bool) -> None:
        """One unit's decision on the wire (docs/realtime-api.md §13.7)."""
        if self._closing_turn:  # the cancelled turn's units: nothing of them is said
            self._closing_turn = not decision.end_of_turn and decision.spoke
            if not self._closing_turn:
                self._emit(self._listen("model_listen"))
            return
        run = self._speaking
        if not decision.spoke:
            if run is None:  # a listen; with end_of_turn, of a model turn that never said anything
                self._emit(self._listen("model_turn_completed_without_output" if decision.end_of_turn
                                        else "model_listen"))
            elif not self._voiced and not at_limit:  # an answer asked for that the model has not begun
                self._emit(self._listen("model_listen", run.id))
                self._schedule_silence()
            else:  # a listen that closes the turn (forced, or the continuation limit): its last audio, then the end
                self._end_turn(run, decision)
                self._emit(self._listen("continuation_limit" if at_limit else "forced_listen", run.id))
                run.complete(self._clock.finish(run.id))
            return
        if run is None:
            run = self._speaking = self.responses.begin_fed()
            self._silence_units = 0
        if not self._voiced:
            self._voiced = True
            self._emit(response_speak(session_id=self.id, epoch=self.responses.epoch, response_id=run.id,
                                      item_id=run.item.id))
        if decision.end_of_turn:
            self._end_turn(run, decision)
            run.complete(self._clock.finish(run.id))
        else:
            self._deliver(run, decision)
            self._schedule_silence()

    def _end_turn(self, run: ResponseRun, decision: UnitDecision) -> None:
        """The model's turn ends with this unit: its last words and audio go to the response."""
        self._speaking, self._voiced = None, False
        self._deliver(run, decision)

    def _deliver(self, run: ResponseRun, decision: UnitDecision) -> None:
        self._clock.unit(run.id, decision.token_times_s)
        chunk = None
        if decision.audio and run.wants_audio:
            chunk = AudioChunk(run.id, decision.audio, self.native.output_sample_rate, 0.0, 0.0)
        if chunk is not None or decision.text:
            run.deliver_unit(chunk, decision.text, end_of_turn=decision.end_of_turn)

    # Silence units (docs/realtime-api.md §13.7) -----------------------------------------------

    def _schedule_silence(self) -> None:
        self._cancel_silence()
        period = self.options.native_duplex.continuation_period_ms / 1000
        self._silence_timer = asyncio.get_running_loop().call_later(period, self._feed_silence)

    def _cancel_silence(self) -> None:
        if self._silence_timer is not None:
            self._silence_timer.cancel()
            self._silence_timer = None

    def _feed_silence(self) -> None:
        """The model speaks and no input came for a unit period: a silence unit keeps it going;
        the last one the limit allows must listen."""
        self._silence_timer = None
        if self._speaking is None or not self._appends.empty():
            return
        self._silence_units += 1
        limit = self.options.native_duplex.continuation_limit_units
        if not self._settings.auto_response:
            limit = min(limit, COMMIT_CONTINUATION_LIMIT)
        last = self._silence_units >= limit
        self._appends.put_nowait(_Append(np.zeros(0, np.float32), force_listen=last,
                                         kind="last_silence" if last else "silence"))

    # End --------------------------------------------------------------------------------------

    async def close(self) -> None:
        self._cancel_silence()
        if self._feeder is not None:
            self._appends.put_nowait(None)
            self._feeder.cancel()
            await asyncio.gather(self._feeder, return_exceptions=True)
        if self._stream is not None:
            await self._stream.close()
        await super().close()
