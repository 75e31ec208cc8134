"""One typed builder per GA server event (docs/realtime-api.md §5).

Each returns the wire dict `event(kind, ...)` gives, with a fresh `event_id` and its fields
in wire order; a field that may be null (`previous_item_id`, a cleared buffer's
`response_id`) is sent as null, never left out. `session.created` and `error` are built by
`session_created` and `error_event` in server_events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm_omni.protocol import server_event_types as kinds
from vllm_omni.protocol.server_events import event

Wire = dict[str, Any]


# Session -----------------------------------------------------------------------------------

def session_updated(*, session: dict[str, Any]) -> Wire:
    return event(kinds.SESSION_UPDATED, session=session)


def session_closed(*, session_id: str, reason: str) -> Wire:
    return event(kinds.SESSION_CLOSED, session_id=session_id, reason=reason, event={})


def session_expired(*, session_id: str, reason: str) -> Wire:
    return event(kinds.SESSION_EXPIRED, session_id=session_id, reason=reason)


def session_resumed(*, session_id: str, session: dict[str, Any], attachment_generation: int,
                    resume_token: str) -> Wire:
    return event(kinds.SESSION_RESUMED, session_id=session_id, session=session,
                 attachment_generation=attachment_generation, resume_token=resume_token)


def session_replaced(*, session_id: str, attachment_generation: int) -> Wire:
    return event(kinds.SESSION_REPLACED, session_id=session_id, attachment_generation=attachment_generation)


def heartbeat_ack(*, session_id: str) -> Wire:
    return event(kinds.SESSION_HEARTBEAT_ACK, session_id=session_id)


def rate_limits_updated(*, rate_limits: Sequence[dict[str, Any]] = ()) -> Wire:
    return event(kinds.RATE_LIMITS_UPDATED, rate_limits=list(rate_limits))


# Input audio buffer ------------------------------------------------------------------------

def speech_started(*, audio_start_ms: int, item_id: str) -> Wire:
    return event(kinds.SPEECH_STARTED, audio_start_ms=audio_start_ms, item_id=item_id)


def speech_stopped(*, audio_end_ms: int, item_id: str) -> Wire:
    return event(kinds.SPEECH_STOPPED, audio_end_ms=audio_end_ms, item_id=item_id)


def audio_buffer_timeout_triggered(*, audio_start_ms: int, audio_end_ms: int, item_id: str) -> Wire:
    return event(kinds.AUDIO_BUFFER_TIMEOUT_TRIGGERED, audio_start_ms=audio_start_ms, audio_end_ms=audio_end_ms,
                 item_id=item_id)


@dataclass(frozen=True)
class CommitRecord:
    """What a commit of streamed input sealed, sent as the committed event's `event` record."""

    session_id: str
    turn_id: int
    epoch: int
    history_len: int  # conversation items after the commit
    deferred: bool = False  # a response was still active: the turn's response waits for it
    flags: tuple[str, ...] = ()  # e.g. ("empty", "overlap_ack", "no_response") for a back-channel; "not_x": x false


def audio_buffer_committed(*, previous_item_id: str | None, item_id: str,
                           record: CommitRecord | None = None) -> Wire:
    """`record`: for input streamed into the buffer; an item created with audio has none."""
    if record is None:
        return event(kinds.AUDIO_BUFFER_COMMITTED, previous_item_id=previous_item_id, item_id=item_id)
    body: Wire = {"type": "input.committed", "session_id": record.session_id, "turn_id": record.turn_id,
                  "epoch": record.epoch, "history_len": record.history_len, "native_audio": True,
                  "realtime_item_id": item_id}
    if record.deferred:
        body.update(overlap_deferred=True, response_create_deferred=True)
    body.update({flag.removeprefix("not_"): not flag.startswith("not_") for flag in record.flags})
    return event(kinds.AUDIO_BUFFER_COMMITTED, previous_item_id=previous_item_id, item_id=item_id, event=body)


def audio_buffer_cleared() -> Wire:
    return event(kinds.AUDIO_BUFFER_CLEARED)


def overlap_decision(*, session_id: str, epoch: int, policy: str, action: str, reason: str,
                     metadata: dict[str, Any] | None = None) -> Wire:
    return event(kinds.OVERLAP_DECISION, session_id=session_id, epoch=epoch, policy=policy, action=action,
                 reason=reason, metadata=metadata or {})


# Conversation items ------------------------------------------------------------------------

def item_added(*, previous_item_id: str | None, item: dict[str, Any]) -> Wire:
    return event(kinds.ITEM_ADDED, previous_item_id=previous_item_id, item=item)


def item_created(*, previous_item_id: str | None, item: dict[str, Any]) -> Wire:
    """The beta name of `conversation.item.added`, sent right after it for beta clients."""
    return event(kinds.ITEM_CREATED, previous_item_id=previous_item_id, item=item)


def item_done(*, previous_item_id: str | None, item: dict[str, Any]) -> Wire:
    return event(kinds.ITEM_DONE, previous_item_id=previous_item_id, item=item)


def item_retrieved(*, item: dict[str, Any]) -> Wire:
    return event(kinds.ITEM_RETRIEVED, item=item)


def item_deleted(*, session_id: str, item_id: str) -> Wire:
    return event(kinds.ITEM_DELETED, item_id=item_id,
                 event={"type": kinds.ITEM_DELETED, "session_id": session_id, "item_id": item_id, "deleted": True})


def item_truncated(*, session_id: str, item_id: str, audio_end_ms: int, content_index: int = 0) -> Wire:
    return event(kinds.ITEM_TRUNCATED, item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms,
                 event={"type": kinds.ITEM_TRUNCATED, "session_id": session_id, "item_id": item_id,
                        "truncated": True})


def input_transcription_completed(*, item_id: str, transcript: str, audio_seconds: float,
                                  content_index: int = 0) -> Wire:
    """`audio_seconds`: the transcribed audio's duration, reported as its `usage`."""
    return event(kinds.INPUT_TRANSCRIPTION_COMPLETED, item_id=item_id, content_index=content_index,
                 transcript=transcript, usage={"type": "duration", "seconds": audio_seconds})


def input_transcription_delta(*, item_id: str, delta: str, content_index: int = 0) -> Wire:
    return event(kinds.INPUT_TRANSCRIPTION_DELTA, item_id=item_id, content_index=content_index, delta=delta)


def input_transcription_failed(*, item_id: str, code: str, message: str, content_index: int = 0) -> Wire:
    return event(kinds.INPUT_TRANSCRIPTION_FAILED, item_id=item_id, content_index=content_index,
                 error={"type": "transcription_error", "code": code, "message": message, "param": None})


# Responses ---------------------------------------------------------------------------------

def response_created(*, response: dict[str, Any]) -> Wire:
    """`response`: a `response_object`; its id is repeated as the event's `response_id`."""
    return event(kinds.RESPONSE_CREATED, response_id=response["id"], response=response)


def response_listen(*, session_id: str, epoch: int, reason: str, response_id: str | None = None) -> Wire:
    """A unit the model listened in (docs/realtime-api.md §13.7); `response_id` only when the
    listen ends that response (its response.done follows)."""
    metadata = {"reason": reason, "model_listen": reason == "model_listen"}
    response = {"object": "realtime.response", "status": "listening", "metadata": metadata}
    fields = {} if response_id is None else {"response_id": response_id}
    return event(kinds.RESPONSE_LISTEN, session_id=session_id, epoch=epoch, **fields, response=response)


def turn_event(*, session_id: str, event_name: str, turn_state: str, epoch: int) -> Wire:
    """The reply to a duplex client's state-changing turn.signal (docs/realtime-api.md §13.9)."""
    return event(kinds.TURN_EVENT, session_id=session_id, event=event_name, turn_state=turn_state, epoch=epoch)


def response_speak(*, session_id: str, epoch: int, response_id: str, item_id: str) -> Wire:
    return event(kinds.RESPONSE_SPEAK, response_id=response_id, item_id=item_id, output_index=0, content_index=0,
                 metadata={"session_id": session_id, "epoch": epoch, "model_speak": True})


def response_done(*, response: dict[str, Any], stage_metrics: dict[str, Any], playback: dict[str, int],
                  committed: bool, timing: dict[str, float] | None = None) -> Wire:
    """`response`: a `response_object`; its id is repeated as the event's `response_id`. The
    [EXT] report (`stage_metrics`, the final `playback` cursor (copied), whether the answer
    entered the history as `committed`, and the server-side `timing` marks) goes in
    `vllm_omni`, outside the GA response."""
    report = {"stage_metrics": stage_metrics, "playback": dict(playback), "committed": committed,
              "timing": dict(timing or {})}
    return event(kinds.RESPONSE_DONE, response_id=response["id"], response=response, vllm_omni=report)


def output_item_added(*, response_id: str, item: dict[str, Any], output_index: int = 0) -> Wire:
    return event(kinds.OUTPUT_ITEM_ADDED, response_id=response_id, output_index=output_index, item=item)


def output_item_done(*, response_id: str, item: dict[str, Any], output_index: int = 0) -> Wire:
    return event(kinds.OUTPUT_ITEM_DONE, response_id=response_id, output_index=output_index, item=item)


# Content parts: addressed by response, item, output index and content index. The keyword
# names match, so a caller can pass one address dict as `**address` to every builder here.

def _part_event(kind: str, response_id: str, item_id: str, output_index: int, content_index: int,
                **fields: Any) -> Wire:
    return event(kind, response_id=response_id, item_id=item_id, output_index=output_index,
                 content_index=content_index, **fields)


def content_part_added(*, response_id: str, item_id: str, part: dict[str, Any], output_index: int = 0,
                       content_index: int = 0) -> Wire:
    return _part_event(kinds.CONTENT_PART_ADDED, response_id, item_id, output_index, content_index, part=part)


def content_part_done(*, response_id: str, item_id: str, part: dict[str, Any], output_index: int = 0,
                      content_index: int = 0) -> Wire:
    return _part_event(kinds.CONTENT_PART_DONE, response_id, item_id, output_index, content_index, part=part)


def output_audio_delta(*, response_id: str, item_id: str, delta: str, format: str, sample_rate_hz: int,
                       audio_duration_ms: int, playback: dict[str, int], session_id: str,
                       output_index: int = 0, content_index: int = 0, end_of_turn: bool = False,
                       audio_text_marks: list[dict[str, int]] | None = None) -> Wire:
    """`delta`: base64 audio. The [EXT] fields go in `vllm_omni`: `audio_duration_ms` is the
    response's audio so far, this chunk included; `playback` is copied, as it is the
    response's live counters; `end_of_turn` marks a natively duplex model's last delta of its
    turn, `audio_text_marks` where the text spoken so far ends in the audio."""
    report = {"format": format, "sample_rate_hz": sample_rate_hz, "audio_duration_ms": audio_duration_ms,
              "end_of_turn": end_of_turn, "playback": dict(playback), "session_id": session_id}
    if audio_text_marks is not None:
        report["audio_text_marks"] = audio_text_marks
    return _part_event(kinds.OUTPUT_AUDIO_DELTA, response_id, item_id, output_index, content_index, delta=delta,
                       vllm_omni=report)


def output_audio_done(*, response_id: str, item_id: str, output_index: int = 0, content_index: int = 0) -> Wire:
    return _part_event(kinds.OUTPUT_AUDIO_DONE, response_id, item_id, output_index, content_index)


def output_audio_transcript_delta(*, response_id: str, item_id: str, delta: str, output_index: int = 0,
                                  content_index: int = 0) -> Wire:
    return _part_event(kinds.OUTPUT_AUDIO_TRANSCRIPT_DELTA, response_id, item_id, output_index, content_index,
                       delta=delta)


def output_audio_transcript_done(*, response_id: str, item_id: str, transcript: str, output_index: int = 0,
                                 content_index: int = 0) -> Wire:
    return _part_event(kinds.OUTPUT_AUDIO_TRANSCRIPT_DONE, response_id, item_id, output_index, content_index,
                       transcript=transcript)


def output_text_delta(*, response_id: str, item_id: str, delta: str, output_index: int = 0,
                      content_index: int = 0) -> Wire:
    return _part_event(kinds.OUTPUT_TEXT_DELTA, response_id, item_id, output_index, content_index, delta=delta)


def output_text_done(*, response_id: str, item_id: str, text: str, output_index: int = 0,
                     content_index: int = 0) -> Wire:
    return _part_event(kinds.OUTPUT_TEXT_DONE, response_id, item_id, output_index, content_index, text=text)


def function_call_arguments_delta(*, response_id: str, item_id: str, output_index: int, call_id: str,
                                  delta: str) -> Wire:
    return event(kinds.FUNCTION_CALL_ARGUMENTS_DELTA, response_id=response_id, item_id=item_id,
                 output_index=output_index, call_id=call_id, delta=delta)


def function_call_arguments_done(*, response_id: str, item_id: str, output_index: int, call_id: str, name: str,
                                 arguments: str) -> Wire:
    return event(kinds.FUNCTION_CALL_ARGUMENTS_DONE, response_id=response_id, item_id=item_id,
                 output_index=output_index, call_id=call_id, name=name, arguments=arguments)


# Output audio and playback -----------------------------------------------------------------

def output_audio_buffer_started(*, response_id: str) -> Wire:
    """WebRTC: the speaker track began playing the response's audio."""
    return event(kinds.OUTPUT_AUDIO_BUFFER_STARTED, response_id=response_id)


def output_audio_buffer_stopped(*, response_id: str) -> Wire:
    """WebRTC: the speaker track played the response's last audio."""
    return event(kinds.OUTPUT_AUDIO_BUFFER_STOPPED, response_id=response_id)


def output_audio_buffer_cleared(*, response_id: str | None) -> Wire:
    """`response_id`: None when there was no response to clear."""
    return event(kinds.OUTPUT_AUDIO_BUFFER_CLEARED, response_id=response_id)


def playback_acknowledged(*, session_id: str, epoch: int, item_id: str, played_ms: int, committed_ms: int,
                          truncate: bool, playback: dict[str, int], history_committed: bool) -> Wire:
    """Everything is in the `event` record; `playback` (the response's live counters, or {}
    without a response) is copied."""
    return event(kinds.PLAYBACK_ACKNOWLEDGED, event={
        "type": kinds.PLAYBACK_ACKNOWLEDGED, "session_id": session_id, "epoch": epoch, "item_id": item_id,
        "played_ms": played_ms, "committed_ms": committed_ms, "truncate": truncate, "playback": dict(playback),
        "history_committed": history_committed})
