"""The feeder of a natively duplex model (docs/realtime-api.md §13.7): it hands the model's stream
whole units, in arrival order, and puts each unit's decision on the wire.

The model's turn is explicit (`ModelTurn`): it listens; a response was asked of it that it
has not begun; it speaks into a response; or, after a barge-in, its cancelled turn is still
closing in its context (its units listen until it has). While the model speaks and no input
arrives, silence units keep it going, up to a limit.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from vllm_omni.engine.interface import UnitEngine
from vllm_omni.engine.native_duplex import DuplexOpening, NativeDuplexStream, UnitDecision
from vllm_omni.engine.request import AudioChunk
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import response_speak
from vllm_omni.protocol.server_events import error_event
from vllm_omni.session.core import SessionCore
from vllm_omni.session.native_response import ResponseTokenClock
from vllm_omni.session.native_units import Piece, Unit, UnitAssembler
from vllm_omni.session.response import ResponseRun

logger = logging.getLogger(__name__)

Marker = Literal["input", "commit", "silence", "last_silence", "answer"]


class ModelTurn(enum.Enum):
    LISTENING = "listening"  # no response is the model's
    ASKED = "asked"  # a response was asked of it (a commit-driven answer) that it has not begun
    SPEAKING = "speaking"  # it speaks into the response (response.speak sent)
    CLOSING = "closing"  # after a barge-in: its units listen until its cancelled turn has closed


@dataclass
class Append:
    """One entry of the feeder's queue: input, or a marker that pads to the unit's end."""

    samples: np.ndarray
    frames: list[bytes] = field(default_factory=list)
    force_listen: bool = False  # every unit this append closes listens
    kind: Marker = "input"
    answer: ResponseRun | None = None  # kind "answer": the response the model's next turn feeds

    @classmethod
    def marker(cls, kind: Marker, *, force_listen: bool = False, answer: ResponseRun | None = None) -> Append:
        return cls(np.zeros(0, np.float32), force_listen=force_listen, kind=kind, answer=answer)


class UnitFeeder:
    def __init__(self, core: SessionCore, native: UnitEngine, continuation_limit: int):
        self.core = core
        self.native = native
        self._continuation_limit = continuation_limit  # silence units one response may be fed
        self._stream: NativeDuplexStream | None = None
        self._appends: asyncio.Queue[Append | None] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.turn = ModelTurn.LISTENING
        self.run: ResponseRun | None = None  # the response the model's turn feeds (ASKED, SPEAKING)
        self._silence_timer: asyncio.TimerHandle | None = None
        self._silence_units = 0  # fed into the current response
        self._last_silence_at: float | None = None  # when the last silence unit was due, since the last input
        self._unit = UnitAssembler()  # the model gets each unit whole
        self.pending_bytes = 0  # input samples not yet handed to the model (queued or in `_unit`)
        self._clock = ResponseTokenClock()  # stage 0's metrics of the response the model speaks

    def start(self, opening: DuplexOpening) -> None:
        """Open the model's stream: its context prefill runs first, ahead of any input."""
        self._task = asyncio.create_task(self._feed(opening), name=f"native-duplex-{self.core.id}")

    def put(self, append: Append) -> None:
        if append.kind == "input":
            self.pending_bytes += append.samples.nbytes
            self._last_silence_at = None
        self._appends.put_nowait(append)

    def answer(self, run: ResponseRun) -> None:
        """A response asked of the model: once it has heard what came before, it gets silence
        units until it has spoken its turn (or the limit)."""
        self.put(Append.marker("answer", answer=run))

    def model_turn_cancelled(self) -> None:
        """The response is gone; the model's next unit listens, which closes its turn."""
        self.run, self.turn = None, ModelTurn.CLOSING
        self.cancel_silence()

    # The model --------------------------------------------------------------------------------

    async def _feed(self, opening: DuplexOpening) -> None:
        try:
            self._stream = await self.native.open_stream(opening)
        except Exception as exc:
            logger.exception("session %s: the model could not open", self.core.id)
            self.core.emit(error_event(ProtocolError("engine_error", f"the model could not start this session "
                                                     f"({type(exc).__name__}: {exc})")))
            return
        while (item := await self._appends.get()) is not None:
            if item.kind == "answer":
                if item.answer is self.core.responses.active:  # not cancelled meanwhile
                    self.run, self.turn, self._silence_units = item.answer, ModelTurn.ASKED, 0
                    self._schedule_silence()
                continue
            if item.kind == "input":
                self._unit.add(Piece(item.samples, item.frames, item.force_listen))
            elif item.kind != "commit" or self._unit.samples:  # a commit right on a unit's end adds nothing
                self._unit.pad(self._stream.samples_to_boundary(), item.force_listen)
            while (unit := self._unit.take(self._stream.samples_to_boundary())) is not None:
                self.pending_bytes -= unit.samples.nbytes
                await self._decide_unit(unit, at_limit=item.kind == "last_silence")

    async def _decide_unit(self, unit: Unit, at_limit: bool) -> None:
        """One model call per unit, however the audio arrived (session/native_units.py)."""
        try:
            self._clock.submitting()
            decisions = await self._stream.append(unit.samples, frame_groups=unit.frame_groups,
                                                  force_listen=unit.force_listen or self.turn is ModelTurn.CLOSING)
            for decision in decisions:
                self._decided(decision, at_limit=at_limit)
        except Exception as exc:  # the session goes on: the next input gets the next units
            logger.exception("session %s: a unit failed", self.core.id)
            self.core.emit(error_event(ProtocolError("engine_error", f"the model failed on this input "
                                                     f"({type(exc).__name__}: {exc})")))

    def _decided(self, decision: UnitDecision, at_limit: bool) -> None:
        """One unit's decision on the wire (docs/realtime-api.md §13.7)."""
        core, run = self.core, self.run
        if self.turn is ModelTurn.CLOSING:  # the cancelled turn's units: nothing of them is said
            if decision.end_of_turn or not decision.spoke:
                self.turn = ModelTurn.LISTENING
                core.emit(core.listen("model_listen"))
            return
        if not decision.spoke:
            if run is None:  # a listen; with end_of_turn, of a model turn that never said anything
                core.emit(core.listen("model_turn_completed_without_output" if decision.end_of_turn
                                      else "model_listen"))
            elif self.turn is ModelTurn.ASKED and not at_limit:  # asked for, not begun
                core.emit(core.listen("model_listen", run.id))
                self._schedule_silence()
            else:  # a listen that closes the turn (forced, or the continuation limit): its last audio, then the end
                self._end_turn(run, decision)
                core.emit(core.listen("continuation_limit" if at_limit else "forced_listen", run.id))
                run.complete(self._clock.finish(run.id))
            return
        if run is None:
            run = self.run = core.responses.begin_fed()
            self._silence_units = 0
        if self.turn is not ModelTurn.SPEAKING:
            self.turn = ModelTurn.SPEAKING
            core.emit(response_speak(session_id=core.id, epoch=core.responses.epoch, response_id=run.id,
                                     item_id=run.item.id))
        if decision.end_of_turn:
            self._end_turn(run, decision)
            run.complete(self._clock.finish(run.id))
        else:
            self._deliver(run, decision)
            self._schedule_silence()

    def _end_turn(self, run: ResponseRun, decision: UnitDecision) -> None:
        """The model's turn ends with this unit: its last words and audio go to the response."""
        self.run, self.turn = None, ModelTurn.LISTENING
        self._deliver(run, decision)

    def _deliver(self, run: ResponseRun, decision: UnitDecision) -> None:
        self._clock.unit(run.id, decision.token_times_s)
        chunk = None
        if decision.audio and run.wants_audio:
            chunk = AudioChunk(run.id, decision.audio, self.native.output_sample_rate, 0.0, 0.0)
        if chunk is not None or decision.text:
            run.deliver_unit(chunk, decision.text, end_of_turn=decision.end_of_turn)

    # Silence units ----------------------------------------------------------------------------

    def _schedule_silence(self) -> None:
        """The next silence unit is due a period after the last one (or after now, when input
        came since): silence units keep the model's speech at real time however long each
        took to decide."""
        self.cancel_silence()
        loop = asyncio.get_running_loop()
        period = self.core.options.native_duplex.continuation_period_ms / 1000
        last = loop.time() if self._last_silence_at is None else self._last_silence_at
        self._silence_timer = loop.call_at(max(loop.time(), last + period), self._feed_silence)

    def cancel_silence(self) -> None:
        if self._silence_timer is not None:
            self._silence_timer.cancel()
            self._silence_timer = None

    def _feed_silence(self) -> None:
        """The model speaks and no input came for a unit period: a silence unit keeps it going;
        the last one the limit allows must listen."""
        self._silence_timer = None
        if self.run is None or not self._appends.empty():
            return
        self._last_silence_at = asyncio.get_running_loop().time()
        self._silence_units += 1
        last = self._silence_units >= self._continuation_limit
        self.put(Append.marker("last_silence" if last else "silence", force_listen=last))

    # End --------------------------------------------------------------------------------------

    async def close(self) -> None:
        self.cancel_silence()
        if self._task is not None:
            self._appends.put_nowait(None)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._stream is not None:
            await self._stream.close()
