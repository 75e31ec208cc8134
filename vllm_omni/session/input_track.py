"""The user's audio in a turn-mode session: format and conversion, the uncommitted buffer on
the session's timeline, the engine's audio stream fed while the user speaks, server VAD
(speech start / stop, server-initiated commits; with semantic_vad, the end-of-turn model's
verdict at each pause, §2.4.2) and the idle timer (docs/realtime-api.md §2.4.1).

Times are 16 kHz samples since the session started (`timeline`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vllm_omni.audio.end_of_turn import WINDOW_SAMPLES, EndOfTurnModel
from vllm_omni.audio.formats import (
    AudioFormat,
    AudioFormatError,
    InputConverter,
    check_rate,
    decode_base64,
)
from vllm_omni.audio.model_files import ModelFileUnavailableError
from vllm_omni.audio.pcm import AudioDataError
from vllm_omni.audio.sample_buffer import SampleBuffer
from vllm_omni.audio.silero_vad import ServerVADUnavailableError, SileroModel, VadConfig, VadDetector, samples_to_ms
from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.request import AudioInputStream
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import audio_buffer_timeout_triggered, speech_started, speech_stopped
from vllm_omni.protocol.server_events import error_event, new_id
from vllm_omni.protocol.session_config import SEMANTIC_VAD_PAUSES_MS, TurnDetection, parse_format
from vllm_omni.session.base import Emit
from vllm_omni.session.conversation import Item

MAX_PENDING_INPUT_BYTES = 16 * 1024 * 1024  # uncommitted input per session (as float32 samples)
MIN_TURN_AUDIO_MS = 100  # shortest user audio a turn or item may hold (as the GA API requires)
MIN_TURN_SAMPLES = MIN_TURN_AUDIO_MS * 16


@dataclass
class SealedTurn:
    """Committed input: the user item it became and how many samples the user gave for it."""

    item: Item
    samples: int


class InputTrack:
    """One session's input. Server-VAD outcomes go to the session through `on_speech_started`
    (to barge in) and `on_server_commit` (a turn VAD or the idle timer sealed); the idle timer
    does nothing while `busy()` (a response is active)."""

    def __init__(self, engine: EngineClient, emit: Emit, *,
                 vad_model_path: str | None, end_of_turn_model_path: str | None,
                 on_speech_started: Callable[[], None],
                 on_server_commit: Callable[[SealedTurn], None], busy: Callable[[], bool]):
        self.engine = engine
        self._emit = emit
        self.vad_model_path, self.end_of_turn_model_path = vad_model_path, end_of_turn_model_path
        self._on_speech_started, self._on_server_commit, self._busy = on_speech_started, on_server_commit, busy
        self.timeline = 0  # 16 kHz samples accepted since the session started
        self.pending = SampleBuffer()  # uncommitted input on the timeline
        self.turn_detection: TurnDetection | None = None
        self._converter = InputConverter()
        self._stream: AudioInputStream | None = None
        self._fed_until = 0
        self.segment_item: str | None = None  # open speech segment (speech_started sent)
        self._end_hint_ms: int | None = None  # a heuristic segment's end on the client's clock
        self._transcript_hints: list[str] = []
        self.skipped_silence = False  # a non-speech append was left out since the last commit/clear
        self._skipped = 0  # samples left out while input was pending: the timeline takes them once it is empty
        self._vad: VadDetector | None = None
        self._end_of_turn: EndOfTurnModel | None = None  # semantic_vad's judge of pauses
        self._judgement: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    @property
    def detecting(self) -> bool:
        """Whether server VAD runs (turn detection on and its model loaded)."""
        return self._vad is not None

    # Configuration ----------------------------------------------------------------------------

    def configure(self, turn_detection: TurnDetection | None) -> None:
        """(Re)build server VAD for `turn_detection` (None: manual commits only)."""
        self.turn_detection = turn_detection
        self.disarm_idle_timer()
        self._close_segment(emit_stop=False)
        self._vad = self._end_of_turn = None
        if turn_detection is None:
            return
        self._skipped = 0  # server VAD counts from the timeline as it stands
        try:
            model = SileroModel.load(self.vad_model_path)
        except ServerVADUnavailableError as exc:
            self._emit(error_event(ProtocolError("server_vad_unavailable", str(exc))))
            return
        td = turn_detection
        pause_check_ms = None
        if td.type == "semantic_vad":
            self._end_of_turn = self._load_end_of_turn_model(td)
            pause_check_ms = SEMANTIC_VAD_PAUSES_MS[td.eagerness][0] if self._end_of_turn else None
        self._vad = VadDetector(model, VadConfig(threshold=td.threshold, prefix_padding_ms=td.prefix_padding_ms,
                                                 silence_duration_ms=td.silence_duration_ms,
                                                 min_speech_duration_ms=td.min_speech_duration_ms,
                                                 pause_check_ms=pause_check_ms),
                                start_sample=self.timeline)

    def _load_end_of_turn_model(self, td: TurnDetection) -> EndOfTurnModel | None:
        """semantic_vad's model; without it, turns end after the eagerness's longest pause."""
        try:
            return EndOfTurnModel.load(self.end_of_turn_model_path)
        except ModelFileUnavailableError as exc:
            self._emit(error_event(ProtocolError(
                "server_vad_unavailable",
                f"{exc}; semantic_vad turns end after {td.silence_duration_ms:.0f} ms of silence")))
            return None

    # Appends ---------------------------------------------------------------------------------

    def append(self, ev: ce.InputAudioBufferAppend, session_format: AudioFormat) -> None:
        """input_audio_buffer.append: decode in the event's (or the session's) format, then take."""
        self.take(ev, self.decode(ev, session_format))

    def decode(self, ev: ce.InputAudioBufferAppend, session_format: AudioFormat) -> np.ndarray:
        """An append's audio as 16 kHz float32 samples (nothing is kept yet)."""
        if ev.video_frames:
            raise ProtocolError("bad_event", "this model takes no video frames; send images as "
                                "conversation.item.create items with input_image content", "video_frames")
        if not ev.payload:
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'audio'.", "audio")
        fmt = _append_format(ev, session_format)
        try:
            samples = self._converter.convert(decode_base64(ev.payload), fmt)
        except AudioDataError as exc:
            raise ProtocolError("bad_audio", str(exc), "audio") from None
        except AudioFormatError as exc:
            raise ProtocolError("bad_event", str(exc), "sample_rate_hz") from None
        return samples

    def take(self, ev: ce.InputAudioBufferAppend, samples: np.ndarray) -> None:
        """Keep an append's decoded samples (and its transcript hint) for the turn."""
        if ev.transcript:
            self._transcript_hints.append(ev.transcript)
        self.accept(samples)
        self._note_end_hint(ev)

    def heard(self, ev: ce.InputAudioBufferAppend, samples: np.ndarray) -> None:
        """Samples the model took as they came (a natively duplex session): on the timeline, not kept."""
        self.timeline += samples.size
        self.pending.drop_until(self.timeline)
        self._fed_until = self.timeline
        self._note_end_hint(ev)

    def skip(self, samples: np.ndarray) -> None:
        """A non-speech append the duplex lane does not keep (docs/realtime-api.md §13.6). It
        still counts on the client's clock: the timeline takes it once nothing is pending."""
        self.skipped_silence = True
        self._skipped += samples.size
        self._take_skipped()

    def _take_skipped(self) -> None:
        if self._skipped and self.pending.size == 0:
            self.timeline += self._skipped
            self.pending.drop_until(self.timeline)
            self._fed_until, self._skipped = self.timeline, 0

    def open_heuristic_segment(self, ev: ce.InputAudioBufferAppend, start_sample: int) -> None:
        """Without server VAD, the first append judged speech (taken at `start_sample`) opens a
        speech segment: speech_started at its `audio_start_ms` hint, else its timeline position
        (docs/realtime-api.md §13.6); the commit closes it."""
        self.segment_item = new_id("item_")
        start_ms = samples_to_ms(start_sample) if ev.audio_start_ms is None else round(ev.audio_start_ms)
        self._emit(speech_started(audio_start_ms=start_ms, item_id=self.segment_item))
        self._note_end_hint(ev)

    def _note_end_hint(self, ev: ce.InputAudioBufferAppend) -> None:
        """A heuristic segment ends at the client's `audio_end_ms` clock when it sends one."""
        if self._vad is None and self.segment_item is not None and ev.audio_end_ms is not None:
            self._end_hint_ms = round(ev.audio_end_ms)

    def accept(self, samples: np.ndarray) -> None:
        """Put 16 kHz samples on the timeline; with server VAD, detect and commit turns."""
        if self._vad is None and (self.pending.size + samples.size) * 4 > MAX_PENDING_INPUT_BYTES:
            raise ProtocolError("input_backpressure", "uncommitted input exceeds 16 MiB; commit or clear it",
                                "audio")
        end = self.timeline + samples.size
        self.pending.append(samples)
        self.timeline = end
        if self._vad is None:
            self._feed_stream(end)
            return
        result = self._vad.feed(samples)
        if result.started:
            self._open_segment(result.start_sample)
        if self.segment_item is not None:
            self._feed_stream(result.end_sample if result.stopped else end)
        if result.pause_sample is not None and self._end_of_turn is not None:
            self._judge_pause(self._end_of_turn, result.pause_sample)
        if result.stopped and self.segment_item is not None:
            if result.should_commit:
                self._end_turn(result.end_sample)
            else:
                self._emit(speech_stopped(audio_end_ms=samples_to_ms(result.end_sample), item_id=self.segment_item))
        if self.segment_item is None:
            self._keep_onset_reach()

    def _end_turn(self, end_sample: int) -> None:
        """Server VAD ends the open speech segment at `end_sample` and commits it as a turn."""
        item_id = self.segment_item
        self._emit(speech_stopped(audio_end_ms=samples_to_ms(end_sample), item_id=item_id))
        self.segment_item = None
        self._vad.reset()
        self._on_server_commit(self._seal(end_sample, item_id, server_initiated=True))

    def _judge_pause(self, model: EndOfTurnModel, pause_sample: int) -> None:
        """semantic_vad (docs/realtime-api.md §2.4.2): the model judges the speech up to this
        pause off the event loop; the turn ends here if it sounds finished and no speech came
        since. Otherwise the pause runs on, and `silence_duration_ms` ends it."""
        if not self._vad.pause_is_current(pause_sample):
            return
        self._cancel_judgement()
        audio = self.pending.view(pause_sample - WINDOW_SAMPLES, pause_sample)
        self._judgement = asyncio.get_running_loop().create_task(
            self._end_turn_if_finished(model, self.segment_item, pause_sample, audio))

    async def _end_turn_if_finished(self, model: EndOfTurnModel, item_id: str | None, pause_sample: int,
                                    audio: np.ndarray) -> None:
        finished = await model.sounds_finished(audio)
        if finished and self.segment_item == item_id and self._vad is not None \
                and self._vad.pause_is_current(pause_sample):
            try:
                self._end_turn(pause_sample)
            except ProtocolError as exc:
                self._emit(error_event(exc))
            self._keep_onset_reach()

    def _cancel_judgement(self) -> None:
        if self._judgement is not None:
            self._judgement.cancel()
            self._judgement = None

    def _keep_onset_reach(self) -> None:
        """Outside speech, keep only the audio a coming onset can reach back to (its prefix
        padding plus the speech it needs to be detected), so silence does not pile up."""
        td = self.turn_detection
        reach = round((td.prefix_padding_ms + max(32.0, td.min_speech_duration_ms)) * 16) + 2 * 512
        self.pending.drop_until(self.pending.end - reach)

    def _open_segment(self, start_sample: int) -> None:
        start = max(start_sample, self.pending.start)
        self.pending.drop_until(start)  # audio before the onset (and its prefix padding) is dropped
        self._stream, self._fed_until = None, start
        self.segment_item = new_id("item_")
        self.disarm_idle_timer()
        self._emit(speech_started(audio_start_ms=samples_to_ms(start), item_id=self.segment_item))
        self._on_speech_started()

    def _feed_stream(self, upto: int) -> None:
        """Hand the engine's audio stream everything pending up to timeline sample `upto`."""
        if upto <= self._fed_until:
            return
        if self._stream is None:
            self._stream = self.engine.create_audio_stream()
            self._fed_until = self.pending.start
        piece = self.pending.view(self._fed_until, upto)
        if piece.size:
            self._stream.append(piece)
        self._fed_until = upto

    def _close_segment(self, emit_stop: bool) -> None:
        self._cancel_judgement()
        if self.segment_item is not None and emit_stop:
            end_ms = samples_to_ms(self.timeline + self._skipped) if self._end_hint_ms is None else self._end_hint_ms
            self._emit(speech_stopped(audio_end_ms=end_ms, item_id=self.segment_item))
        self.segment_item, self._end_hint_ms = None, None
        if self._vad is not None:
            self._vad.reset()

    # Commit and clear ------------------------------------------------------------------------

    def commit(self) -> SealedTurn:
        """A client commit: everything appended (an open speech segment ends here)."""
        self._take_held_back()
        if self.pending.size < MIN_TURN_SAMPLES:
            raise commit_too_small(self.pending.size)
        return self._seal(self.timeline, self.close_speech())

    def _take_held_back(self) -> None:
        """The few ms the input resampler still holds, onto the timeline before a client's
        commit or clear (server VAD's cuts leave them: they come after the cut)."""
        tail = self._converter.flush()
        if tail.size:
            self.accept(tail)

    def close_speech(self) -> str | None:
        """End the open speech segment, if any, with speech_stopped; its item id."""
        open_item = self.segment_item
        if open_item is not None:
            self._close_segment(emit_stop=True)
        return open_item

    def _seal(self, end_sample: int, item_id: str | None, server_initiated: bool = False) -> SealedTurn:
        """Pending input up to `end_sample` as a user item. A client commit needs at least
        MIN_TURN_AUDIO_MS of audio (and keeps the buffer when refused); a shorter
        server-initiated turn (server VAD, idle timeout: possibly empty) is padded with silence."""
        count = end_sample - self.pending.start
        if count < MIN_TURN_SAMPLES and not server_initiated:
            raise commit_too_small(count)
        self.disarm_idle_timer()
        self._feed_stream(end_sample)
        self.pending.drop_until(end_sample)
        stream = self._stream if self._stream is not None else self.engine.create_audio_stream()
        if count < MIN_TURN_SAMPLES:
            stream.append(np.zeros(MIN_TURN_SAMPLES - max(count, 0), np.float32))
        item = Item(id=item_id or new_id("item_"), role="user", stream=stream,
                    audio_ms=samples_to_ms(max(count, MIN_TURN_SAMPLES)), transcript=" ".join(self._transcript_hints))
        self._stream, self._fed_until, self._transcript_hints = None, end_sample, []
        self.skipped_silence = False
        self._take_skipped()
        return SealedTurn(item, count)

    def clear(self) -> None:
        """Drop everything uncommitted (an open speech segment ends without speech_stopped)."""
        self._take_held_back()
        self._close_segment(emit_stop=False)
        self.pending.drop_until(self.timeline)
        self._stream, self._fed_until, self._transcript_hints = None, self.timeline, []
        self.skipped_silence = False
        self._take_skipped()

    # Idle timer ------------------------------------------------------------------------------

    def arm_idle_timer(self, answer_ms: int) -> None:
        """docs/realtime-api.md §2.4.1: once an answer of `answer_ms` has played and
        `idle_timeout_ms` more pass without speech, the (possibly empty) buffer is committed by
        the server."""
        td = self.turn_detection
        if td is None or td.idle_timeout_ms is None or self._vad is None:
            return
        self.disarm_idle_timer()
        delay = (answer_ms + td.idle_timeout_ms) / 1000
        self._idle_timer = asyncio.get_running_loop().call_later(delay, self._on_idle_timeout)

    def close(self) -> None:
        """The session ends: no timer or judgement outlives it."""
        self.disarm_idle_timer()
        self._cancel_judgement()

    def disarm_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _on_idle_timeout(self) -> None:
        self._idle_timer = None
        if self._busy() or self.segment_item is not None:
            return
        item_id = new_id("item_")
        self._emit(audio_buffer_timeout_triggered(audio_start_ms=samples_to_ms(self.pending.start),
                                                  audio_end_ms=samples_to_ms(self.timeline), item_id=item_id))
        self._vad.reset()
        self._on_server_commit(self._seal(self.timeline, item_id, server_initiated=True))


def commit_too_small(samples: int) -> ProtocolError:
    """A client commit of fewer than MIN_TURN_SAMPLES samples."""
    return ProtocolError("input_audio_buffer_commit_empty", "Error committing input audio buffer: buffer too small. "
                         f"Expected at least {MIN_TURN_AUDIO_MS}ms of audio, but buffer only has "
                         f"{max(samples, 0) / 16:.2f}ms of audio.")


def _append_format(ev: ce.InputAudioBufferAppend, session_format: AudioFormat) -> AudioFormat:
    """The format of one append: the session's, unless the event names its own format or rate."""
    fmt = session_format
    override = ev.input_audio_format or ev.format
    if override is not None:
        fmt = parse_format(override, output=False, param="input_audio_format")
    for key in ("sample_rate_hz", "sample_rate"):
        try:
            rate = check_rate(getattr(ev, key), key)
        except ValueError as exc:
            raise ProtocolError("bad_event", str(exc), key) from None
        if rate is not None:
            return AudioFormat(fmt.name, rate)
    return fmt
