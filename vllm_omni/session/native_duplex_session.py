"""A native duplex session (docs/realtime-api.md §13.7): the model hears the input unit by unit
and decides itself, per unit, whether to listen or to speak (MiniCPM-o 4.5).

It keeps the duplex lane's parts (opening, atomic updates, items, the playback ledger, resume)
and replaces how input reaches the model and how responses start: every append goes, in
arrival order, to the session's model stream; each unit the model decides becomes
`response.listen`, or a delta of the response its speaking turn opened (`response.speak`
first). While the model speaks and no input arrives, silence units keep it going, up to a
limit. A barge-in cancels the response and makes the next unit listen, which closes the
model's turn in its context: the context is kept, never re-read.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from vllm_omni.audio.voice_prompt import decode_voice_prompt
from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.native_duplex import (
    DEFAULT_WINDOW,
    ContextWindow,
    DuplexOpening,
    NativeDuplexEngine,
    NativeDuplexStream,
    ScriptedDecision,
    UnitDecision,
    WindowMode,
)
from vllm_omni.engine.request import AudioChunk
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.images import frames_from_append
from vllm_omni.protocol.server_event_builders import overlap_decision, response_listen, response_speak
from vllm_omni.protocol.server_events import error_event, new_id
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.protocol.session_update import SessionUpdateResult
from vllm_omni.session.base import Emit, SessionOptions
from vllm_omni.session.conversation import Item
from vllm_omni.session.duplex_session import DuplexSession
from vllm_omni.session.input_track import MIN_TURN_SAMPLES, SealedTurn, commit_too_small
from vllm_omni.session.overlap import decide_native
from vllm_omni.session.response import ResponseRun

logger = logging.getLogger(__name__)

UNIT_SAMPLES = 16000  # a silence unit (docs/realtime-api.md §13.7)
TEST_DECISIONS = get_args(ScriptedDecision)
WINDOW_SIZES = {"basic_window_high_tokens": "high_tokens", "basic_window_low_tokens": "low_tokens",
                "context_max_units": "max_units", "context_previous_max_tokens": "previous_max_tokens"}
WINDOW_KEYS = ("sliding_window_mode", *WINDOW_SIZES)
MAX_QUEUED_APPENDS = 64  # appends waiting for the model: beyond, input_backpressure


@dataclass(frozen=True)
class NativeSettings:
    """A native session's model-facing fields (fixed when it opens; only auto_response sessions)."""

    force_listen_count: int
    test_decisions: tuple[str, ...]
    window: ContextWindow


@dataclass
class _Append:
    samples: np.ndarray
    frames: list[bytes] = field(default_factory=list)
    force_listen: bool = False
    kind: Literal["input", "commit", "silence", "last_silence"] = "input"  # commit: pad to the unit's end


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
        self._closing_turn = False  # after a barge-in: units listen until the model's turn has closed
        self._silence_timer: asyncio.TimerHandle | None = None
        self._silence_units = 0  # fed into the current response
        self._model_opening: DuplexOpening | None = None
        self._uncommitted = 0  # samples since the last commit (kept as a count: the model has heard them)

    # Opening ----------------------------------------------------------------------------------

    def _check_opening(self, opening: dict[str, Any]) -> None:
        """The model-facing fields, kept for `opened` (the audio modality is checked after the
        opening applies, as it may set it)."""
        self._settings = native_settings(opening, self.options)

    def configure_opening(self, opening: dict[str, Any]) -> None:
        super().configure_opening(opening)
        self._model_opening = native_opening(opening, self.config.wants_audio, self._settings)

    def opened(self) -> None:
        """Open the model's stream: its context prefill runs first in the feeder, ahead of any input."""
        self._feeder = asyncio.create_task(self._feed(self._model_opening), name=f"native-duplex-{self.id}")

    def capabilities(self) -> dict[str, Any]:
        return {**super().capabilities(), "implementation_level": "model_native_duplex",
                "supports_model_native_turn_policy": True, "supports_text_only_turn": False,
                "supports_turn_commit_only": False, "optional_input_modalities": ["video"],
                "supports_image_input": False, "adapter_patterns": ["model_native_units"],
                "signal_sources": ["client_event", "model"]}

    def _session_update(self, update: dict[str, Any]) -> SessionUpdateResult:
        if "instructions" in update:
            raise ProtocolError("instructions_update_unsupported", "instructions are part of the model's context: "
                                "they can only be set when the session opens", "instructions")
        extra = update.get("extra_body") or {}
        window = next((key for key in WINDOW_KEYS if key in update or key in extra), None)
        if window is not None:
            raise ProtocolError("sliding_window_update_unsupported", f"{window} can only be set when the session "
                                "opens", window)
        return super()._session_update(update)

    # Input ------------------------------------------------------------------------------------

    def _append_native(self, ev: ce.InputAudioBufferAppend) -> None:
        frames = frames_from_append(ev.video_frames) if ev.video_frames else []
        if not ev.payload:
            if frames:
                raise ProtocolError("invalid_input_modality", "this model needs audio with every append; frames "
                                    "ride the append that closes their unit", "audio")
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'audio'.", "audio")
        samples = self.input.decode(ev.model_copy(update={"video_frames": None}), self.config.input_format)
        if self._appends.qsize() >= MAX_QUEUED_APPENDS:
            raise ProtocolError("input_backpressure", f"{MAX_QUEUED_APPENDS} appends are waiting for the model; "
                                "send audio at real-time pace")
        if self.responses.active is not None:
            decision = decide_native(ev, samples, policy=self.config.overlap_policy)
            self._emit(overlap_decision(session_id=self.id, epoch=self.responses.epoch,
                                        policy=self.config.overlap_policy, action=decision.action,
                                        reason=decision.reason, metadata={"duration_ms": samples.size // 16,
                                                                          "buffer_audio": True}))
            if decision.action == "barge_in":
                self._barge_in("barge_in")
        if self.input.detecting:  # server VAD needs the samples (it keeps only what a turn can need)
            self.input.take(ev, samples)
        else:
            self._uncommitted += samples.size
        self._cancel_silence()
        self._appends.put_nowait(_Append(samples, frames, bool(ev.force_listen)))

    def _server_commit(self, sealed: SealedTurn) -> None:
        """Server VAD ends the user's turn in the history only: the model owns when it answers."""
        self._commit(sealed)

    def _commit_native(self, ev: ce.InputAudioBufferCommit) -> None:
        """The input so far becomes a user item (its audio is the model's: the item records how
        long it was); a residual shorter than a unit is padded with silence to the unit's end,
        so the model decides it now."""
        if self.input.detecting:
            sealed = self.input.commit()
        else:
            if self._uncommitted < MIN_TURN_SAMPLES:
                raise commit_too_small(self._uncommitted)
            sealed = SealedTurn(Item(id=new_id("item_"), role="user", audio_ms=self._uncommitted // 16),
                                self._uncommitted)
            self._uncommitted = 0
        self._commit(sealed)
        self._appends.put_nowait(_Append(np.zeros(0, np.float32), kind="commit"))

    def _clear_input(self, ev: ce.ClientEvent) -> None:
        self._uncommitted = 0
        super()._clear_input(ev)

    async def _create_native(self, ev: ce.ResponseCreate) -> None:
        raise ProtocolError("response_create_without_input", "this model decides itself when to speak: stream "
                            "audio (or commit it) and it answers unit by unit")

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
        self._speaking = None
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
            if item.kind == "commit":  # pad the residual to the unit's end
                missing = self._stream.samples_to_boundary()
                if missing == UNIT_SAMPLES:
                    continue
                item.samples = np.zeros(missing, np.float32)
            try:
                decisions = await self._stream.append(item.samples, frames=item.frames,
                                                      force_listen=item.force_listen or self._closing_turn)
            except Exception as exc:
                logger.exception("session %s: a unit failed", self.id)
                self._emit(error_event(ProtocolError("engine_error", f"the model failed on this input "
                                                     f"({type(exc).__name__}: {exc})")))
                continue
            for decision in decisions:
                self._decided(decision, at_limit=item.kind == "last_silence")

    def _decided(self, decision: UnitDecision, at_limit: bool) -> None:
        """One unit's decision on the wire (docs/realtime-api.md §13.7)."""
        if self._closing_turn:  # the cancelled turn's units: nothing of them is said
            self._closing_turn = not decision.end_of_turn and decision.spoke
            if not self._closing_turn:
                self._emit(self._listen("model_listen"))
            return
        run = self._speaking
        if not decision.spoke:
            if run is None:
                self._emit(self._listen("model_listen"))
                return
            # a listen that closes the turn (forced, or the continuation limit): its last audio, then the end
            self._speaking = None
            self._deliver(run, decision)
            self._emit(self._listen("continuation_limit" if at_limit else "forced_listen", run.id))
            run.complete()
            return
        if run is None:
            run = self._speaking = self.responses.begin_fed()
            self._silence_units = 0
            self._emit(response_speak(session_id=self.id, epoch=self.responses.epoch, response_id=run.id,
                                      item_id=run.item.id))
        self._deliver(run, decision)
        if decision.end_of_turn:
            self._speaking = None
            run.complete()
        else:
            self._schedule_silence()

    def _deliver(self, run: ResponseRun, decision: UnitDecision) -> None:
        chunk = None
        if decision.audio and run.wants_audio:
            chunk = AudioChunk(run.id, decision.audio, self.native.output_sample_rate, 0.0, 0.0)
        if chunk is not None or decision.text:
            run.deliver_unit(chunk, decision.text, end_of_turn=decision.end_of_turn)

    def _listen(self, reason: str, response_id: str | None = None) -> dict[str, Any]:
        return response_listen(session_id=self.id, epoch=self.responses.epoch, reason=reason,
                               response_id=response_id)

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
        last = self._silence_units >= self.options.native_duplex.continuation_limit_units
        missing = self._stream.samples_to_boundary() if self._stream is not None else UNIT_SAMPLES
        self._appends.put_nowait(_Append(np.zeros(missing, np.float32), force_listen=last,
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


def native_settings(opening: dict[str, Any], options: SessionOptions) -> NativeSettings:
    """The opening's model-facing `extra_body` fields, checked."""
    extra = opening.get("extra_body") or {}
    if not isinstance(extra, dict):
        raise ProtocolError("invalid_session_config", "extra_body must be an object", "extra_body")
    auto_response = extra.get("auto_response", True)
    if auto_response is not True:
        raise ProtocolError("invalid_session_config", "only auto_response sessions are served (the model hears "
                            "the input unit by unit and decides when to speak)", "extra_body.auto_response")
    count = extra.get("force_listen_count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ProtocolError("invalid_session_config", "force_listen_count must be a non-negative integer",
                            "extra_body.force_listen_count")
    script = extra.get("duplex_test_decisions")
    if script is not None:
        if not options.native_duplex.allow_test_decisions:
            raise ProtocolError("invalid_session_config", "duplex_test_decisions is a test control this deploy "
                                "does not enable", "extra_body.duplex_test_decisions")
        if not isinstance(script, list) or any(step not in TEST_DECISIONS for step in script):
            raise ProtocolError("invalid_session_config", f"duplex_test_decisions must be a list of "
                                f"{', '.join(TEST_DECISIONS)}", "extra_body.duplex_test_decisions")
    return NativeSettings(count, tuple(script or ()), context_window(extra))


def context_window(extra: dict[str, Any]) -> ContextWindow:
    """The `extra_body` window keys (docs/minicpmo.md, "Context windows"), checked."""
    mode = extra.get("sliding_window_mode", DEFAULT_WINDOW.mode)
    if mode not in get_args(WindowMode):
        raise ProtocolError("invalid_sliding_window_config", f"sliding_window_mode must be one of "
                            f"{', '.join(get_args(WindowMode))}", "extra_body.sliding_window_mode")
    sizes = {}
    for key, name in WINDOW_SIZES.items():
        value = extra.get(key, getattr(DEFAULT_WINDOW, name))
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ProtocolError("invalid_sliding_window_config", f"{key} must be a positive integer",
                                f"extra_body.{key}")
        sizes[name] = value
    if sizes["low_tokens"] >= sizes["high_tokens"]:
        raise ProtocolError("invalid_sliding_window_config", "basic_window_low_tokens must be below "
                            "basic_window_high_tokens", "extra_body.basic_window_low_tokens")
    return ContextWindow(mode, **sizes)


def native_opening(opening: dict[str, Any], wants_audio: bool, settings: NativeSettings) -> DuplexOpening:
    """The model context's start: instructions and the voice prompt (required for audio output)."""
    ref_audio = opening.get("ref_audio")
    if ref_audio is None:
        if wants_audio:
            raise ProtocolError("ref_audio_required", "this model speaks in the voice of ref_audio: send it "
                                "(a WAV data URL) when the session opens, or ask for text only", "ref_audio")
        voice = None
    else:
        if not isinstance(ref_audio, str):
            raise ProtocolError("invalid_session_config", "ref_audio must be a WAV data URL", "ref_audio")
        try:
            voice = decode_voice_prompt(ref_audio)
        except ValueError as exc:
            raise ProtocolError("invalid_session_config", str(exc), "ref_audio") from None
    instructions = opening.get("instructions")
    extra = opening.get("extra_body") or {}
    user_text = opening.get("initial_user_text", extra.get("duplex_initial_user_text"))
    if user_text is not None and not isinstance(user_text, str):
        raise ProtocolError("invalid_session_config", "initial_user_text must be a string", "initial_user_text")
    return DuplexOpening(instructions=instructions if isinstance(instructions, str) and instructions else None,
                         initial_user_text=user_text or None, voice_prompt=voice, wants_audio=wants_audio,
                         force_listen_count=settings.force_listen_count, test_decisions=settings.test_decisions,
                         window=settings.window)
