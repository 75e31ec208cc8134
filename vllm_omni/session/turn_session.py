"""A turn-mode realtime session (GA lane): input buffer, server VAD, items, responses.

Client events are applied one at a time, in arrival order (`handle`). Outgoing events go
through `emit`, which only enqueues, so everything a handler emits leaves in the order it
was produced. Responses run as tasks of this session and end with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from vllm_omni.audio.formats import (
    AudioDataError,
    AudioFormat,
    AudioFormatError,
    InputConverter,
    check_rate,
    decode_base64,
)
from vllm_omni.audio.sample_buffer import SampleBuffer
from vllm_omni.audio.silero_vad import ServerVADUnavailableError, SileroModel, VadConfig, VadDetector, samples_to_ms
from vllm_omni.engine.request import AudioInputStream, OmniRequest
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_events import error_event, event, new_id
from vllm_omni.protocol.session_config import SessionConfig, apply_session_update, parse_format, session_object
from vllm_omni.session.conversation import Conversation, Item
from vllm_omni.session.response import ResponseOptions, ResponseRun

logger = logging.getLogger(__name__)

MAX_PENDING_INPUT_BYTES = 16 * 1024 * 1024  # uncommitted input per session (as float32 samples)
MAX_KEPT_RESPONSES = 64  # finished responses a session still answers playback acks for
MIN_TURN_AUDIO_MS = 100  # shortest user audio a turn or item may hold (as the GA API requires)
MIN_TURN_SAMPLES = MIN_TURN_AUDIO_MS * 16
DEFAULT_MAX_HISTORY_AUDIO_S = 1200.0  # user speech a conversation keeps (as log-mel features: ~61 MB)

CAPABILITIES = {
    "implementation_level": "turn_based_duplex", "chunk_period_ms": 1000,
    "supports_model_native_turn_policy": False, "supports_barge_in": True, "supports_input_append": True,
    "supports_session_resume": False, "supports_session_lease": False, "supports_audio_truncate": True,
    "supports_image_input": False, "supports_text_only_turn": True, "supports_core_resumable_request": False,
    "supports_multi_session": True, "required_input_modalities": ["audio"], "optional_input_modalities": [],
    "session_admission_mode": "engine_managed", "input_modes": ["append_audio_chunk"],
    "adapter_patterns": ["turn_commit"], "signal_sources": ["client_event", "server_policy"],
    "supports_client_commit": True, "supports_playback_ack": True, "supports_turn_commit_only": True,
    "supports_reencode_context": True, "supports_realtime_endpoint": True,
}


class TurnSession:
    def __init__(self, engine: Any, config: SessionConfig, served_models: list[str], *,
                 emit: Callable[[dict[str, Any]], None], default_speaker: str, speakers: list[str],
                 vad_model_path: str | None = None, max_history_audio_s: float = DEFAULT_MAX_HISTORY_AUDIO_S):
        self.engine = engine
        self.config = config
        self.served_models = served_models
        self._emit = emit
        self.default_speaker, self.speakers = default_speaker, speakers
        self.vad_model_path = vad_model_path
        self.max_history_audio_ms = int(max_history_audio_s * 1000)
        self.conversation = Conversation()
        self.epoch = 0
        self.turn_id = 0
        self.timeline = 0  # 16 kHz samples accepted since the session started
        self._converter = InputConverter()
        self._pending = SampleBuffer()  # uncommitted input on the session timeline
        self._stream: AudioInputStream | None = None
        self._fed_until = 0
        self._segment_item: str | None = None  # open speech segment (speech_started sent)
        self._transcript_hints: list[str] = []
        self._vad: VadDetector | None = None
        self.active: ResponseRun | None = None
        self.responses: dict[str, ResponseRun] = {}
        self.last_response: ResponseRun | None = None
        self._unanswered = False
        self._deferred = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._rebuild_vad()

    # Output ---------------------------------------------------------------------------------

    def emit(self, payload: dict[str, Any]) -> None:
        self._emit(payload)

    def session_object(self) -> dict[str, Any]:
        active = self.active
        return session_object(self.config, {
            "state": "open", "turn_state": "assistant_generating" if active else "idle", "epoch": self.epoch,
            "turn_id": self.turn_id, "active_request_id": active.request_id if active else None,
            "active_response_id": active.id if active else None, "active_response_turn_id": None,
            "playback": dict(active.playback) if active else
            {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0},
            "capabilities": {**CAPABILITIES, "supports_multi_session_same_replica": True}})

    # Dispatch ---------------------------------------------------------------------------------

    async def handle(self, ev: ce.ClientEvent) -> None:
        handler = getattr(self, "on_" + ev.type.replace(".", "_"), None)
        if handler is None:
            raise ProtocolError("unknown_event", f"Unknown event type: {ev.type}", "type")
        await handler(ev)

    async def on_session_update(self, ev: ce.SessionUpdate) -> None:
        update = ev.session if ev.session is not None else ({"model": ev.model} if ev.model else {})
        before = self.config.turn_detection
        self.config = apply_session_update(self.config, update, self.served_models)
        if self.config.turn_detection != before:
            self._rebuild_vad()
        self.emit(event("session.updated", session=self.session_object()))

    def _rebuild_vad(self) -> None:
        td = self.config.turn_detection
        self._disarm_idle_timer()
        self._close_segment(emit_stop=False)
        if td is None:
            self._vad = None
            return
        try:
            model = SileroModel.load(self.vad_model_path)
        except ServerVADUnavailableError as exc:
            self._vad = None
            self.emit(error_event(ProtocolError("server_vad_unavailable", str(exc))))
            return
        self._vad = VadDetector(model, VadConfig(threshold=td.threshold, prefix_padding_ms=td.prefix_padding_ms,
                                                 silence_duration_ms=td.silence_duration_ms,
                                                 min_speech_duration_ms=td.min_speech_duration_ms),
                                start_sample=self.timeline)

    # Input audio ------------------------------------------------------------------------------

    def _append_format(self, ev: ce.InputAudioBufferAppend) -> AudioFormat:
        fmt = self.config.input_format
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

    async def on_input_audio_buffer_append(self, ev: ce.InputAudioBufferAppend) -> None:
        if ev.video_frames:
            raise ProtocolError("bad_event", "this model takes no video frames; send images as "
                                "conversation.item.create items with input_image content", "video_frames")
        if not ev.payload:
            raise ProtocolError("bad_event", "input_audio_buffer.append requires audio", "audio")
        fmt = self._append_format(ev)
        try:
            samples = self._converter.convert(decode_base64(ev.payload), fmt)
        except AudioDataError as exc:
            raise ProtocolError("bad_audio", str(exc), "audio") from None
        except AudioFormatError as exc:
            raise ProtocolError("bad_event", str(exc), "sample_rate_hz") from None
        if ev.transcript:
            self._transcript_hints.append(ev.transcript)
        self._accept(samples)

    def _accept(self, samples: np.ndarray) -> None:
        if self._vad is None and (self._pending.size + samples.size) * 4 > MAX_PENDING_INPUT_BYTES:
            raise ProtocolError("input_backpressure", "uncommitted input exceeds 16 MiB; commit or clear it",
                                "audio")
        end = self.timeline + samples.size
        self._pending.append(samples)
        self.timeline = end
        if self._vad is None:
            self._feed_stream(end)
            return
        result = self._vad.feed(samples)
        if result.started:
            self._open_segment(result.start_sample)
        if self._segment_item is not None:
            self._feed_stream(result.end_sample if result.stopped else end)
        if result.stopped and self._segment_item is not None:
            item_id = self._segment_item
            self.emit(event("input_audio_buffer.speech_stopped", audio_end_ms=samples_to_ms(result.end_sample),
                            item_id=item_id))
            if result.should_commit:
                self._segment_item = None
                self._vad.reset()
                self._commit(result.end_sample, item_id, server_initiated=True)
                if self.config.turn_detection.create_response:
                    self._respond_or_defer()
        if self._segment_item is None:
            self._keep_onset_reach()

    def _keep_onset_reach(self) -> None:
        """Outside speech, keep only the audio a coming onset can reach back to (its prefix
        padding plus the speech it needs to be detected), so silence does not pile up."""
        td = self.config.turn_detection
        reach = round((td.prefix_padding_ms + max(32.0, td.min_speech_duration_ms)) * 16) + 2 * 512
        self._pending.drop_until(self._pending.end - reach)

    def _open_segment(self, start_sample: int) -> None:
        start = max(start_sample, self._pending.start)
        self._pending.drop_until(start)  # audio before the onset (and its prefix padding) is dropped
        self._stream, self._fed_until = None, start
        self._segment_item = new_id("item_")
        self._disarm_idle_timer()
        self.emit(event("input_audio_buffer.speech_started", audio_start_ms=samples_to_ms(start),
                        item_id=self._segment_item))
        td = self.config.turn_detection
        if self.active is not None and td is not None and td.interrupt_response:
            self.emit(event("overlap.decision", session_id=self.config.id, epoch=self.epoch,
                            policy="barge_in_on_speech", action="barge_in", reason="server_vad_speech_started",
                            metadata={}))
            self._cancel_active("turn_detected")

    def _feed_stream(self, upto: int) -> None:
        """Hand the engine's audio stream everything pending up to timeline sample `upto`."""
        if upto <= self._fed_until:
            return
        if self._stream is None:
            self._stream = self.engine.create_audio_stream()
            self._fed_until = self._pending.start
        piece = self._pending.view(self._fed_until, upto)
        if piece.size:
            self._stream.append(piece)
        self._fed_until = upto

    def _close_segment(self, emit_stop: bool) -> None:
        if self._segment_item is not None and emit_stop:
            self.emit(event("input_audio_buffer.speech_stopped", audio_end_ms=samples_to_ms(self.timeline),
                            item_id=self._segment_item))
        self._segment_item = None
        if self._vad is not None:
            self._vad.reset()

    def _commit(self, end_sample: int, item_id: str | None, server_initiated: bool = False) -> None:
        """Seal pending input up to `end_sample` as a user item; emit the commit fan-out.
        A client commit needs at least MIN_TURN_AUDIO_MS of audio (and keeps the buffer when
        refused); a shorter server-initiated turn (server VAD, idle timeout: possibly empty)
        is padded with silence to that length."""
        count = end_sample - self._pending.start
        if count < MIN_TURN_SAMPLES and not server_initiated:
            raise ProtocolError("input_audio_buffer_empty",
                                "input_audio_buffer.commit requires a non-empty input audio buffer" if count <= 0
                                else f"input_audio_buffer.commit: the buffer holds {samples_to_ms(count)} ms of "
                                     f"audio; at least {MIN_TURN_AUDIO_MS} ms is required")
        self._disarm_idle_timer()
        self._feed_stream(end_sample)
        self._pending.drop_until(end_sample)
        stream = self._stream if self._stream is not None else self.engine.create_audio_stream()
        if count < MIN_TURN_SAMPLES:
            stream.append(np.zeros(MIN_TURN_SAMPLES - max(count, 0), np.float32))
        item = Item(id=item_id or new_id("item_"), role="user", stream=stream,
                    audio_ms=samples_to_ms(max(count, MIN_TURN_SAMPLES)), transcript=" ".join(self._transcript_hints))
        self._stream, self._fed_until, self._transcript_hints = None, end_sample, []
        previous = self._add_item(item, None)
        for kind in ("conversation.item.added", "conversation.item.created"):
            self.emit(event(kind, previous_item_id=previous, item=item.to_wire()))
        deferred = self.active is not None
        commit_record = {"type": "input.committed", "session_id": self.config.id, "turn_id": self.turn_id,
                         "epoch": self.epoch, "history_len": len(self.conversation.items),
                         "native_audio": True, "realtime_item_id": item.id}
        if deferred:
            commit_record.update(overlap_deferred=True, response_create_deferred=True)
        self.emit(event("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id,
                        event=commit_record))
        if item.transcript:
            self.emit(event("conversation.item.input_audio_transcription.completed", item_id=item.id,
                            content_index=0, transcript=item.transcript,
                            usage={"type": "duration", "seconds": count / 16000}))
        self.emit(event("conversation.item.done", previous_item_id=previous, item=item.to_wire()))
        self.turn_id += 1
        self._unanswered = True

    async def on_input_audio_buffer_commit(self, ev: ce.InputAudioBufferCommit) -> None:
        open_item = self._segment_item
        if open_item is not None:
            self._close_segment(emit_stop=True)
        self._commit(self.timeline, open_item)
        wants_response = ev.create_response if ev.create_response is not None else ev.response_create
        if wants_response is None:
            wants_response = ev.type == "input.commit"
        if wants_response:
            self._respond_or_defer()

    on_input_commit = on_input_audio_buffer_commit

    async def on_input_audio_buffer_clear(self, ev: ce.ClientEvent) -> None:
        self._drop_input()
        self.emit(event("input_audio_buffer.cleared"))

    def _drop_input(self) -> None:
        self._close_segment(emit_stop=False)
        self._pending.drop_until(self.timeline)
        self._stream, self._fed_until, self._transcript_hints = None, self.timeline, []

    # Conversation items -----------------------------------------------------------------------

    async def on_conversation_item_create(self, ev: ce.ConversationItemCreate) -> None:
        raw = ev.item
        if raw is None:
            raise ProtocolError("bad_event", "conversation.item.create requires item", "item")
        if raw.type == "function_call_output":
            raise ProtocolError("invalid_function_call_output", "no function call of this session matches",
                                "item.call_id")
        if raw.type != "message":
            raise ProtocolError("bad_event", f"unsupported item type {raw.type!r}", "item.type")
        if raw.id is not None and self.conversation.find(raw.id) is not None:
            raise ProtocolError("bad_event", f"an item with id {raw.id!r} already exists", "item.id")
        item = Item(id=raw.id or new_id("item_"), role=raw.role)
        texts, audio = [], []
        for index, part in enumerate(raw.content):
            where = f"item.content.{index}"
            if isinstance(part, ce.TextPart):
                texts.append(part.text)
            elif isinstance(part, ce.ImagePart):
                raise ProtocolError("unsupported", "this model does not take image input", where)
            elif raw.role != "user":
                raise ProtocolError("bad_event", f"{raw.role} items cannot carry audio", where)
            else:
                audio.append(self._item_audio(part, where))
                item.transcript = part.transcript or item.transcript
        item.text = "".join(texts) or None
        if audio:
            samples = np.concatenate(audio)
            if samples.size < MIN_TURN_SAMPLES:
                raise ProtocolError("bad_audio", f"item audio is {samples_to_ms(samples.size)} ms long; at least "
                                    f"{MIN_TURN_AUDIO_MS} ms is required", "item.content")
            item.stream = self.engine.create_audio_stream()
            await asyncio.to_thread(item.stream.append, samples)  # features of a long clip: off the event loop
            item.audio_ms = samples_to_ms(samples.size)
        previous = self._add_item(item, ev.previous_item_id)
        for kind in ("conversation.item.added", "conversation.item.created"):
            self.emit(event(kind, previous_item_id=previous, item=item.to_wire()))
        if audio:
            self.emit(event("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id))
        self.emit(event("conversation.item.done", previous_item_id=previous, item=item.to_wire()))
        if raw.role == "user":
            self._unanswered = True

    def _item_audio(self, part: ce.AudioPart, where: str) -> np.ndarray:
        """One audio part decoded to 16 kHz samples; empty parts are refused."""
        fmt = parse_format(part.format, output=False, param=f"{where}.format") if part.format is not None \
            else AudioFormat("pcm16", 16000)
        try:
            rate = check_rate(part.sample_rate_hz)
            if rate is not None:
                fmt = AudioFormat(fmt.name, rate)
            samples = InputConverter().convert(decode_base64(part.audio or part.data or ""), fmt)
        except AudioDataError as exc:
            raise ProtocolError("bad_audio", str(exc), f"{where}.audio") from None
        except ValueError as exc:
            raise ProtocolError("bad_event", str(exc), f"{where}.sample_rate_hz") from None
        if samples.size == 0:
            raise ProtocolError("bad_audio", "item audio is empty", f"{where}.audio")
        return samples

    def _add_item(self, item: Item, previous_item_id: str | None) -> str | None:
        """Insert `item`; user speech beyond the session's cap leaves the history oldest-first."""
        previous = self._insert(item, previous_item_id)
        self.conversation.drop_oldest_audio(self.max_history_audio_ms)
        return previous

    def _insert(self, item: Item, previous_item_id: str | None) -> str | None:
        if previous_item_id is None:
            return self.conversation.add(item)
        if previous_item_id == "root":
            self.conversation.items.insert(0, item)
            return None
        anchor = self.conversation.find(previous_item_id)
        if anchor is None:
            raise ProtocolError("item_not_found", f"Conversation item not found: {previous_item_id}",
                                "previous_item_id")
        self.conversation.items.insert(self.conversation.items.index(anchor) + 1, item)
        return previous_item_id

    def _item(self, item_id: str | None) -> Item:
        if not item_id:
            raise ProtocolError("missing_item_id", "item_id is required", "item_id")
        item = self.conversation.find(item_id)
        if item is None:
            raise ProtocolError("item_not_found", f"Conversation item not found: {item_id}", "item_id")
        return item

    async def on_conversation_item_delete(self, ev: ce.ItemReference) -> None:
        item = self._item(ev.item_id)
        self.conversation.remove(item.id)
        self.emit(event("conversation.item.deleted", item_id=item.id,
                        event={"type": "conversation.item.deleted", "session_id": self.config.id,
                               "item_id": item.id, "deleted": True}))

    async def on_conversation_item_retrieve(self, ev: ce.ItemReference) -> None:
        self.emit(event("conversation.item.retrieved", item=self._item(ev.item_id).to_wire()))

    async def on_conversation_item_truncate(self, ev: ce.ConversationItemTruncate) -> None:
        item = self._item(ev.item_id)
        if item.role != "assistant":
            raise ProtocolError("bad_event", "conversation.item.truncate only supports assistant message items",
                                "item_id")
        if ev.content_index != 0:
            raise ProtocolError("bad_event", "conversation.item.truncate content_index out of range",
                                "content_index")
        if ev.audio_end_ms is None:
            raise ProtocolError("bad_event", "conversation.item.truncate requires audio_end_ms", "audio_end_ms")
        end = int(ev.audio_end_ms)
        if end > item.audio_duration_ms:
            raise ProtocolError("bad_event", "audio_end_ms exceeds item audio duration", "audio_end_ms")
        run = next((r for r in self.responses.values() if r.item is item), None)
        if run is not None:
            run.cut_transcript(end)
            run.playback["played_ms"] = run.playback["committed_ms"] = end
        self.emit(event("conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=end,
                        event={"type": "conversation.item.truncated", "session_id": self.config.id,
                               "item_id": item.id, "truncated": True}))
        self._acknowledged(item.id, end, end, True, run)

    # Responses --------------------------------------------------------------------------------

    def _options(self, overrides: dict[str, Any]) -> ResponseOptions:
        cfg = self.config
        modalities = overrides.get("output_modalities", overrides.get("modalities"))
        if modalities is not None:
            if not isinstance(modalities, list) or not modalities or \
                    any(m not in ("audio", "text") for m in modalities):
                raise ProtocolError("bad_event", "output_modalities must list 'audio' and/or 'text'",
                                    "response.output_modalities")
            modalities = ["text", "audio"] if "audio" in modalities else ["text"]
        out_fmt = overrides.get("output_audio_format", overrides.get("response_format"))
        nested = overrides.get("audio", {}).get("output", {}) if isinstance(overrides.get("audio"), dict) else {}
        out_fmt = out_fmt if out_fmt is not None else nested.get("format")
        voice = overrides.get("voice", nested.get("voice", cfg.voice))
        if voice is not None and not isinstance(voice, str):
            raise ProtocolError("bad_event", "voice must be a name (voice objects are not supported)",
                                "response.audio.output.voice")
        if overrides.get("tools"):
            raise ProtocolError("invalid_duplex_runtime_config", "tool calling is not supported by this model",
                                "response.tools")
        tokens = ce.token_limit(next((overrides[k] for k in ("max_output_tokens", "max_response_output_tokens",
                                                             "max_tokens") if k in overrides), cfg.max_output_tokens))
        limited = isinstance(tokens, int)
        speaker = voice.lower() if voice is not None and voice.lower() in self.speakers \
            else self.default_speaker
        metadata = overrides.get("metadata") if isinstance(overrides.get("metadata"), dict) else \
            (cfg.metadata if isinstance(cfg.metadata, dict) else {})
        return ResponseOptions(
            modalities=modalities or list(cfg.modalities),
            output_format=parse_format(out_fmt, output=True, param="response.output_audio_format")
            if out_fmt is not None else cfg.output_format,
            voice=voice, speaker=speaker, instructions=overrides.get("instructions", cfg.instructions),
            max_output_tokens=tokens if limited else "inf", temperature=overrides.get("temperature", cfg.temperature),
            metadata=dict(metadata), client_limited=limited, in_conversation=overrides.get("conversation") != "none")

    async def on_response_create(self, ev: ce.ResponseCreate) -> None:
        if self.active is not None:
            raise ProtocolError("response_already_active",
                                "response.create cannot start while another response is active.")
        if not self._unanswered:
            raise ProtocolError("response_create_without_input",
                                "response.create requires committed audio or text to answer")
        self._start_response(self._options(ev.response.model_dump(exclude_unset=True)))

    def _respond_or_defer(self) -> None:
        if self.active is not None:
            self._deferred = True
        else:
            self._start_response(self._options({}))

    def _start_response(self, options: ResponseOptions) -> None:
        self._disarm_idle_timer()
        response_id = new_id("resp_")
        item = Item(id=f"item_{response_id}", role="assistant", status="in_progress")
        sampling: dict[str, dict[str, Any]] = {"thinker": {}}
        if options.client_limited:
            sampling["thinker"]["max_tokens"] = options.max_output_tokens
        if options.temperature is not None:
            sampling["thinker"]["temperature"] = options.temperature
        messages = self.conversation.messages(options.instructions)
        # An out-of-band answer (conversation "none") is streamed with its item events but
        # does not enter the history.
        previous = self.conversation.add(item) if options.in_conversation else self.conversation.last_id()
        run = ResponseRun(response_id, options, item, session_id=self.config.id, emit=self.emit,
                          on_done=self._response_done)
        self.active = self.last_response = run
        self.responses[response_id] = run
        if options.in_conversation:  # an out-of-band answer leaves the turn unanswered in the conversation
            self._unanswered = False
        request = OmniRequest(messages, request_id=f"{self.config.id}-{response_id}", speaker=options.speaker,
                              modalities=tuple(options.modalities), sampling=sampling)
        run.start(self.engine, request, previous)

    def _response_done(self, run: ResponseRun) -> None:
        if self.active is run:
            self.active = None
        while len(self.responses) > MAX_KEPT_RESPONSES:  # acks and cancels name recent responses only
            del self.responses[next(iter(self.responses))]
        if run.status == "completed":
            self._arm_idle_timer(run)
        if self._deferred and run.status == "completed" and self._unanswered:
            self._deferred = False
            self._start_response(self._options({}))
        elif run.status != "completed":
            self._deferred = False

    def _arm_idle_timer(self, run: ResponseRun) -> None:
        """§2.4.1: once the answer has played (done + its duration) and `idle_timeout_ms` more
        pass without speech, the (possibly empty) buffer is committed and answered."""
        td = self.config.turn_detection
        if td is None or td.idle_timeout_ms is None or self._vad is None:
            return
        self._disarm_idle_timer()
        delay = (run.item.audio_duration_ms + td.idle_timeout_ms) / 1000
        self._idle_timer = asyncio.get_running_loop().call_later(delay, self._on_idle_timeout)

    def _disarm_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _on_idle_timeout(self) -> None:
        self._idle_timer = None
        if self.active is not None or self._segment_item is not None:
            return
        item_id = new_id("item_")
        self.emit(event("input_audio_buffer.timeout_triggered", audio_start_ms=samples_to_ms(self._pending.start),
                        audio_end_ms=samples_to_ms(self.timeline), item_id=item_id))
        self._vad.reset()
        self._commit(self.timeline, item_id, server_initiated=True)
        if self.config.turn_detection.create_response:
            self._respond_or_defer()

    def _cancel_active(self, reason: str) -> bool:
        run = self.active
        if run is None:
            return False
        self.epoch += 1
        run.cut_transcript(run.playback["committed_ms"])
        return run.cancel(self.engine, reason)

    async def on_response_cancel(self, ev: ce.ResponseReference) -> None:
        if ev.response_id:
            run = self.responses.get(ev.response_id)
            if run is None or run.done:
                raise ProtocolError("response_not_active", f"Response is already complete: {ev.response_id}",
                                    "response_id")
            if run is not self.active:
                raise ProtocolError("response_not_active", f"Response is not active: {ev.response_id}",
                                    "response_id")
        elif self.active is None:
            raise ProtocolError("response_not_active", "response.cancel requires an active response")
        self._cancel_active("client_cancelled")

    async def on_output_audio_buffer_clear(self, ev: ce.ResponseReference) -> None:
        run = self.responses.get(ev.response_id) if ev.response_id else (self.active or self.last_response)
        self.emit(event("output_audio_buffer.cleared", response_id=run.id if run else None))
        if run is not None and run is self.active:
            self._cancel_active("output_audio_buffer_clear")

    async def on_playback_ack(self, ev: ce.PlaybackAck) -> None:
        response_id = ev.response_id
        if response_id is None and ev.item_id and ev.item_id.startswith("item_"):
            response_id = ev.item_id[len("item_"):]
        if ev.item_id and response_id and ev.item_id != f"item_{response_id}":
            raise ProtocolError("playback_item_mismatch", "item_id must be item_<response_id>", "item_id")
        run = self.responses.get(response_id) if response_id else (self.active or self.last_response)
        if run is None:
            raise ProtocolError("playback_item_not_found", "no assistant item for that response", "response_id")
        if ev.played_ms is None:
            raise ProtocolError("bad_event", "playback.ack requires numeric played_ms", "played_ms")
        played = max(0, int(ev.played_ms))
        committed = max(0, int(ev.committed_ms)) if ev.committed_ms is not None else played
        run.playback["played_ms"] = max(run.playback["played_ms"], played)
        run.playback["committed_ms"] = max(run.playback["committed_ms"], int(committed))
        if ev.truncate:
            run.cut_transcript(int(committed))
        self._acknowledged(run.item.id, played, int(committed), ev.truncate, run)

    on_audio_playback_ack = on_playback_ack

    def _acknowledged(self, item_id: str, played: int, committed: int, truncate: bool,
                      run: ResponseRun | None) -> None:
        self.emit(event("playback.acknowledged", event={
            "type": "playback.acknowledged", "session_id": self.config.id, "epoch": self.epoch,
            "item_id": item_id, "played_ms": played, "committed_ms": committed, "truncate": truncate,
            "playback": dict(run.playback) if run else {}, "history_committed": truncate}))

    async def on_input_cancel(self, ev: ce.ClientEvent) -> None:
        self._drop_input()
        if not self._cancel_active("barge_in"):
            self.emit(event("input_audio_buffer.cleared"))

    on_barge_in = on_input_cancel

    async def on_session_heartbeat(self, ev: ce.ClientEvent) -> None:
        self.emit(event("session.heartbeat_ack", session_id=self.config.id))

    async def on_input_text_append(self, ev: ce.InputTextAppend) -> None:
        if not isinstance(ev.text, str):
            raise ProtocolError("bad_event", "input.text.append requires text", "text")
        raise ProtocolError("native_text_append_unsupported",
                            "send text as a conversation.item.create user message")

    on_push_text = on_input_text_append

    # End --------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop everything this session started (no cancelled response.done is sent)."""
        self._disarm_idle_timer()
        run = self.active
        if run is not None and not run.done:
            run.done = True
            if run.request_id:
                await self.engine.abort(run.request_id)
        tasks = [r.task for r in self.responses.values() if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.active = None
        self.conversation.items.clear()  # what the session holds goes with it
        self._drop_input()
