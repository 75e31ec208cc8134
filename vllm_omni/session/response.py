"""One response of a turn-mode session: an engine request and the events it produces.

The response emits, in order (docs/realtime-api.md §6.0 R(r)): response.created, the
assistant item, its parts, the deltas as the engine streams them, and the `*.done` block
ending in response.done and rate_limits.updated — exactly once, whether it completes,
fails or is cancelled. After `done` is set nothing more is emitted for it, so output of a
cancelled response never reaches the client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from vllm_omni.audio.formats import OutputEncoder
from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.request import (
    AudioChunk,
    FinishReason,
    OmniRequest,
    RequestError,
    RequestFinished,
    StageMetrics,
    StageUnavailableError,
    TextDelta,
    ToolCall,
)
from vllm_omni.metrics import prometheus as metrics
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import (
    content_part_added,
    content_part_done,
    function_call_arguments_delta,
    function_call_arguments_done,
    item_done,
    output_audio_delta,
    output_audio_done,
    output_audio_transcript_delta,
    output_audio_transcript_done,
    output_item_added,
    output_item_done,
    output_text_delta,
    output_text_done,
    rate_limits_updated,
    response_created,
    response_done,
)
from vllm_omni.protocol.server_events import b64, error_event, new_id, response_object
from vllm_omni.protocol.states import ResponseStatus
from vllm_omni.session.base import Emit
from vllm_omni.session.conversation import Item, announce
from vllm_omni.session.response_options import ResponseOptions

logger = logging.getLogger(__name__)


def stage_metrics_wire(metrics_by_stage: dict[str, StageMetrics]) -> dict[str, Any]:
    """The engine's per-stage metrics in the `stage_metrics` shape (docs/realtime-api.md §5.8), by stage id."""
    return {str(m.stage_id): {
        "stage_id": m.stage_id, "role": m.role, "num_tokens_out": m.outputs,
        "vllm_ttft_ms": round((m.first_output_s or 0) * 1000, 3),
        "vllm_tpot_ms": round((m.mean_interval_s or 0) * 1000, 3),
        "vllm_itls_ms": [round(i * 1000, 3) for i in m.intervals_s],
        "finish_reason": m.finish_reason.value if m.finish_reason is not None else None}
        for m in metrics_by_stage.values()}


class ResponseRun:
    def __init__(self, response_id: str, options: ResponseOptions, item: Item, *, session_id: str,
                 emit: Emit, on_done: Callable[[ResponseRun], None],
                 record_item: Callable[[Item], str | None] | None = None):
        """`record_item` adds an item the response makes (a function call) to the conversation and
        returns the previous item's id; None for an out-of-band answer."""
        self.id = response_id
        self.options = options
        self.item = item
        self.session_id = session_id
        self._emit, self._on_done, self._record_item = emit, on_done, record_item
        self.calls: list[Item] = []  # function_call items, output 1, 2, … (the message is output 0)
        self.done = False
        self.status = ResponseStatus.IN_PROGRESS
        self.request_id: str | None = None
        self.previous_item_id: str | None = None
        self.task: asyncio.Task | None = None
        self.transcript = ""
        self.audio_started = asyncio.Event()  # set at the first audio chunk, or when the response ends
        self._audio_samples = 0
        self._sample_rate = 0
        self._encoder = OutputEncoder(options.output_format)  # one resampler for the whole answer
        self._audio_sent = False
        self._turn_ended = False  # the last audio delta sent had end_of_turn
        self._text_part = False
        self._started_at = time.monotonic()
        self._marks: dict[str, float] = {}  # when the engine got the request, the first text, the first audio
        self._stage_metrics: dict[str, Any] = {}
        self.playback = {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0}
        self.text_marks: list[dict[str, int]] = []  # where each unit's text ends in the audio (fed responses)

    # Addressing -------------------------------------------------------------------------

    @property
    def wants_audio(self) -> bool:
        return "audio" in self.options.modalities

    def _addr(self, content_index: int = 0) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": content_index}

    def _response(self, status: ResponseStatus, **extra: Any) -> dict[str, Any]:
        return response_object(self.id, status.value, modalities=list(self.options.modalities),
                               output_format=self.options.output_format.ga_object(), voice=self.options.voice,
                               max_output_tokens=self.options.max_output_tokens,
                               conversation_id=f"conv_{self.session_id}" if self.options.in_conversation else None,
                               **extra)

    # Lifecycle ----------------------------------------------------------------------------

    def start(self, engine: EngineClient, request: OmniRequest, previous_item_id: str | None) -> None:
        """Announce the response and stream `request`'s outputs into it."""
        self.request_id = request.request_id
        self.open(previous_item_id)
        self.task = asyncio.create_task(self._run(engine, request), name=f"response-{self.id}")

    def open(self, previous_item_id: str | None) -> None:
        """Announce the response: created, its item, the item's first part. A response that no
        engine request streams (a natively duplex model's turn) is then fed with `deliver_unit`."""
        self.previous_item_id = previous_item_id
        self._emit(response_created(response=self._response(
            ResponseStatus.IN_PROGRESS, output=[], metadata=self.options.metadata)))
        if self.options.in_conversation:  # an out-of-band answer's item is in no conversation
            announce(self._emit, previous_item_id, self.item)
        self._emit(output_item_added(response_id=self.id, item=self.item.to_wire()))
        if self.wants_audio:
            self._emit(content_part_added(**self._addr(0), part={"type": "audio", "transcript": ""}))

    def _mark(self, name: str) -> None:
        self._marks.setdefault(name, time.monotonic())

    def timing(self) -> dict[str, float]:
        """Milliseconds from the response's creation to each mark reached (the [EXT] `timing`
        of `response.done`, docs/realtime-api.md §5.8)."""
        return {f"{name}_ms": round((at - self._started_at) * 1000, 3) for name, at in self._marks.items()}

    async def _run(self, engine: EngineClient, request: OmniRequest) -> None:
        self._mark("engine_request")
        try:
            async for output in engine.generate(request):
                if self.done:
                    return
                if isinstance(output, TextDelta):
                    self._on_text(output.text)
                elif isinstance(output, AudioChunk):
                    self._on_audio(output)
                elif isinstance(output, ToolCall):
                    self._on_tool_call(output)
                elif isinstance(output, RequestFinished):
                    self._on_finished(output)
                    return
        except StageUnavailableError as exc:
            self._fail(exc.code, str(exc))
        except RequestError as exc:
            self._fail("invalid_request_error", str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an engine failure fails this response only
            logger.exception("response %s failed", self.id)
            self._fail("engine_error", f"{type(exc).__name__}: {exc}")

    def deliver_unit(self, chunk: AudioChunk | None, text: str, *, end_of_turn: bool) -> None:
        """One unit of a natively duplex model's turn: its audio delta (with the text–audio
        mark, docs/realtime-api.md §13.7) right before its transcript delta."""
        if self.done:
            return
        if chunk is not None:
            self._on_audio(replace(chunk, final=end_of_turn), text_chars=len(self.transcript) + len(text))
        self._on_text(text)

    def complete(self, stage_metrics: dict[str, StageMetrics] | None = None) -> None:
        """End a fed response (the model ended its turn), with the stages' metrics by role."""
        if not self.done:
            self._stage_metrics = stage_metrics_wire(stage_metrics or {})
            self._finish(ResponseStatus.COMPLETED, None, None)

    def _on_text(self, text: str) -> None:
        if not self.transcript:
            self._mark("first_text")
            metrics.TTFT.observe(time.monotonic() - self._started_at)
        self.transcript += text
        self.item.text = self.transcript
        if self.wants_audio:
            self._emit(output_audio_transcript_delta(**self._addr(0), delta=text))
            return
        if not self._text_part:
            self._text_part = True
            self._emit(content_part_added(**self._addr(0), part={"type": "text", "text": ""}))
        self._emit(output_text_delta(**self._addr(0), delta=text))

    def _on_audio(self, chunk: AudioChunk, *, text_chars: int | None = None) -> None:
        """`text_chars`: the transcript's length once this chunk's text is out (a text–audio mark).
        The response's last chunk (`final`) ends the turn (`end_of_turn`)."""
        if not self._audio_sent:
            self._mark("first_audio")
            metrics.TTFP.observe(time.monotonic() - self._started_at)
        self._audio_sent, self._turn_ended = True, chunk.final
        self.audio_started.set()
        self._sample_rate = chunk.sample_rate
        self._audio_samples += len(chunk.pcm16) // 2
        duration_ms = self._audio_samples * 1000 // chunk.sample_rate
        self.item.audio_duration_ms = duration_ms
        if text_chars is not None:
            self.text_marks.append({"text_chars": text_chars, "audio_end_ms": duration_ms})
        data, rate = self._encoder.encode(chunk.pcm16, chunk.sample_rate, final=chunk.final)
        # What the deltas have carried (docs/realtime-api.md §3.2: an output resampler holds a
        # few ms back until the answer's last delta).
        self.playback["generated_ms"] = self.playback["sent_ms"] = self._encoder.delivered_ms
        self._emit(output_audio_delta(**self._addr(0), delta=b64(data), format=self.options.output_format.name,
                                      sample_rate_hz=rate, audio_duration_ms=self._encoder.delivered_ms,
                                      playback=self.playback,
                                      session_id=self.session_id, end_of_turn=chunk.final,
                                      audio_text_marks=self.text_marks[-1:] if text_chars is not None else None))

    def _on_tool_call(self, call: ToolCall) -> None:
        """A function call the model made: its own output item, its arguments in one delta."""
        item = Item(id=new_id("item_"), role="assistant", type="function_call", status="in_progress",
                    call=ToolCall(call.call_id, call.name, ""))
        index = len(self.calls) + 1
        self.calls.append(item)
        previous = self._record_item(item) if self._record_item is not None else None
        if self._record_item is not None:
            announce(self._emit, previous, item)
        self._emit(output_item_added(response_id=self.id, item=item.to_wire(), output_index=index))
        addr = {"response_id": self.id, "item_id": item.id, "output_index": index, "call_id": call.call_id}
        self._emit(function_call_arguments_delta(**addr, delta=call.arguments))
        self._emit(function_call_arguments_done(**addr, name=call.name, arguments=call.arguments))
        item.call, item.status = call, "completed"
        self._emit(output_item_done(response_id=self.id, item=item.to_wire(), output_index=index))
        if self._record_item is not None:
            self._emit(item_done(previous_item_id=previous, item=item.to_wire()))

    def _on_finished(self, final: RequestFinished) -> None:
        self._stage_metrics = stage_metrics_wire(final.stage_metrics)
        if final.finish_reason == FinishReason.ERROR:
            self._fail(final.error_code or "engine_error", final.error or "engine failure")
            return
        if final.finish_reason == FinishReason.ABORT:
            return  # cancelled by us: the cancel path already ended the response
        self._end_turn()
        if final.finish_reason == FinishReason.LENGTH and self.options.client_limited:
            self._finish(ResponseStatus.INCOMPLETE, {"type": "incomplete", "reason": "max_output_tokens"}, final)
        else:
            self._finish(ResponseStatus.COMPLETED, None, final)

    def _end_turn(self) -> None:
        """The end of an answer's audio is on its last delta (`end_of_turn`, docs/realtime-api.md
        §5.4). The engine marks its last chunk, unless that chunk's frames gave no sample (the
        talker's last frame closed a codec chunk): then an empty delta carries the mark."""
        if self._audio_sent and not self._turn_ended:
            end_s = self._audio_samples / self._sample_rate
            self._on_audio(AudioChunk(self.request_id or self.id, b"", self._sample_rate, end_s, end_s, final=True))

    def _fail(self, code: str, message: str) -> None:
        if self.done:
            return
        self._emit(error_event(ProtocolError(code, message)))
        self._finish(ResponseStatus.FAILED, {"type": "failed", "reason": code,
                                "error": {"type": "server_error", "code": code, "message": message}}, None)

    def cancel(self, engine: EngineClient, reason: str) -> bool:
        """Stop generating now; emits the cancelled done block. False if already done."""
        if self.done:
            return False
        self._finish(ResponseStatus.CANCELLED, {"type": "cancelled", "reason": reason}, None)
        if self.request_id is not None:
            asyncio.ensure_future(engine.abort(self.request_id))
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
        return True

    def _finish(self, status: ResponseStatus, details: Any, final: RequestFinished | None) -> None:
        self.done = True
        self.audio_started.set()
        self.status = status
        self.item.status = "incomplete" if status in (ResponseStatus.CANCELLED, ResponseStatus.FAILED) \
            else "completed"
        # The done events carry what the deltas sent; a playback cut (cancel_active, truncate)
        # applies to the item and the history only (docs/realtime-api.md §6.5).
        transcript = self.transcript
        if self.wants_audio:
            if self._audio_sent or self.transcript:
                self._emit(output_audio_done(**self._addr(0)))
            if transcript:
                self._emit(output_audio_transcript_done(**self._addr(0), transcript=transcript))
            self._emit(content_part_done(**self._addr(0), part={"type": "audio", "transcript": transcript}))
        elif self._text_part:
            self._emit(output_text_done(**self._addr(0), text=transcript))
            self._emit(content_part_done(**self._addr(0), part={"type": "text", "text": transcript}))
        item = self.item.to_wire()
        self._emit(output_item_done(response_id=self.id, item=item))
        if self.options.in_conversation:
            self._emit(item_done(previous_item_id=self.previous_item_id, item=item))
        usage = None
        if final is not None:
            self.item.token_ids = final.token_ids
            text_tokens, audio_tokens, prompt, images, heard = final.usage.text_tokens, final.usage.audio_tokens, \
                final.usage.prompt_tokens, final.usage.image_tokens, final.usage.input_audio_tokens
            usage = {"total_tokens": prompt + text_tokens + audio_tokens, "input_tokens": prompt,
                     "output_tokens": text_tokens + audio_tokens,
                     "input_token_details": {"text_tokens": prompt - images - heard, "audio_tokens": heard,
                                             "image_tokens": images, "cached_tokens": final.usage.cached_tokens},
                     "output_token_details": {"text_tokens": text_tokens, "audio_tokens": audio_tokens}}
        output = [item, *(call.to_wire() for call in self.calls)]
        self._emit(response_done(response=self._response(status, status_details=details, output=output, usage=usage,
                                                         metadata=self.options.metadata),
                                 stage_metrics=self._stage_metrics, playback=self.playback, timing=self.timing(),
                                 committed=status is ResponseStatus.COMPLETED and not self.awaits_ack))
        self._emit(rate_limits_updated())
        metrics.RESPONSES.labels(status=status.value).inc()
        if self._audio_samples and self._sample_rate:
            metrics.RTF.observe((time.monotonic() - self._started_at) / (self._audio_samples / self._sample_rate))
        self._on_done(self)

    @property
    def awaits_ack(self) -> bool:
        """ack_only and audio not acknowledged in full: the text stays out of the history."""
        return self.options.history_on_ack and self.item.audio_duration_ms > self.playback["committed_ms"]

    def cut_transcript(self, audio_end_ms: int) -> None:
        """Keep only the text spoken in the first `audio_end_ms`: by the text–audio marks where
        the model gave them (piecewise linear between them), else in proportion."""
        chars = self.spoken_chars(audio_end_ms)
        self.item.text_cap_chars = chars if self.item.text_cap_chars is None else min(chars, self.item.text_cap_chars)

    def spoken_chars(self, audio_end_ms: int) -> int:
        """How much of the transcript the first `audio_end_ms` of audio speak."""
        if self.text_marks:
            ends = [0] + [mark["audio_end_ms"] for mark in self.text_marks]
            chars = [0] + [mark["text_chars"] for mark in self.text_marks]
            return int(np.floor(np.interp(audio_end_ms, ends, chars)))
        total = max(self.item.audio_duration_ms, 1)
        return int(np.floor(len(self.item.text or "") * min(audio_end_ms, total) / total))
