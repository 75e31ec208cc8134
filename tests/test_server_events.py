"""The typed server-event builders: each gives the wire dict the generic `event(kind, ...)`
gave (type, a fresh event_id, then its fields in wire order), and every GA event kind has one."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_omni.protocol import server_event_builders as b
from vllm_omni.protocol import server_event_types
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_events import error_event, session_created

ADDR = {"response_id": "resp_1", "item_id": "item_resp_1", "output_index": 0, "content_index": 0}
ITEM = {"id": "item_1", "object": "realtime.item", "type": "message", "role": "user", "content": []}
RESPONSE = {"id": "resp_1", "object": "realtime.response", "status": "completed"}
PLAYBACK = {"generated_ms": 640, "sent_ms": 640, "played_ms": 0, "committed_ms": 0}
COMMIT = b.CommitRecord(session_id="sess_1", turn_id=2, epoch=1, history_len=3)
COMMITTED = {"type": "input.committed", "session_id": "sess_1", "turn_id": 2, "epoch": 1, "history_len": 3,
             "native_audio": True, "realtime_item_id": "item_1"}

# builder, its keyword arguments, the event type, the fields after type and event_id (in wire order)
CALL = {"response_id": "resp_1", "item_id": "item_call_1", "output_index": 1, "call_id": "call_1", "delta": "{}"}
CALL_DONE = {"response_id": "resp_1", "item_id": "item_call_1", "output_index": 1, "call_id": "call_1",
             "name": "get_weather", "arguments": "{}"}
CASES: list[tuple[Any, dict[str, Any], str, dict[str, Any]]] = [
    (b.session_updated, {"session": {"id": "sess_1"}}, "session.updated", {"session": {"id": "sess_1"}}),
    (b.session_closed, {"session_id": "sess_1", "reason": "client_close"}, "session.closed",
     {"session_id": "sess_1", "reason": "client_close", "event": {}}),
    (b.heartbeat_ack, {"session_id": "sess_1"}, "session.heartbeat_ack", {"session_id": "sess_1"}),
    (b.rate_limits_updated, {}, "rate_limits.updated", {"rate_limits": []}),
    (b.speech_started, {"audio_start_ms": 320, "item_id": "item_1"}, "input_audio_buffer.speech_started",
     {"audio_start_ms": 320, "item_id": "item_1"}),
    (b.speech_stopped, {"audio_end_ms": 1800, "item_id": "item_1"}, "input_audio_buffer.speech_stopped",
     {"audio_end_ms": 1800, "item_id": "item_1"}),
    (b.audio_buffer_timeout_triggered, {"audio_start_ms": 0, "audio_end_ms": 5000, "item_id": "item_1"},
     "input_audio_buffer.timeout_triggered", {"audio_start_ms": 0, "audio_end_ms": 5000, "item_id": "item_1"}),
    (b.audio_buffer_committed, {"previous_item_id": None, "item_id": "item_1"}, "input_audio_buffer.committed",
     {"previous_item_id": None, "item_id": "item_1"}),
    (b.audio_buffer_committed, {"previous_item_id": "item_0", "item_id": "item_1", "record": COMMIT},
     "input_audio_buffer.committed", {"previous_item_id": "item_0", "item_id": "item_1", "event": COMMITTED}),
    (b.audio_buffer_committed,
     {"previous_item_id": "item_0", "item_id": "item_1",
      "record": b.CommitRecord(session_id="sess_1", turn_id=2, epoch=1, history_len=3, deferred=True)},
     "input_audio_buffer.committed",
     {"previous_item_id": "item_0", "item_id": "item_1",
      "event": {**COMMITTED, "overlap_deferred": True, "response_create_deferred": True}}),
    (b.audio_buffer_cleared, {}, "input_audio_buffer.cleared", {}),
    (b.overlap_decision, {"session_id": "sess_1", "epoch": 2, "policy": "barge_in_on_speech", "action": "barge_in",
                          "reason": "server_vad_speech_started"}, "overlap.decision",
     {"session_id": "sess_1", "epoch": 2, "policy": "barge_in_on_speech", "action": "barge_in",
      "reason": "server_vad_speech_started", "metadata": {}}),
    (b.response_listen, {"session_id": "duplex-1", "epoch": 0, "reason": "model_listen"}, "response.listen",
     {"session_id": "duplex-1", "epoch": 0, "response": {
         "object": "realtime.response", "status": "listening",
         "metadata": {"reason": "model_listen", "model_listen": True}}}),
    (b.response_listen, {"session_id": "duplex-1", "epoch": 1, "reason": "continuation_limit",
                         "response_id": "resp_1"}, "response.listen",
     {"session_id": "duplex-1", "epoch": 1, "response_id": "resp_1", "response": {
         "object": "realtime.response", "status": "listening",
         "metadata": {"reason": "continuation_limit", "model_listen": False}}}),
    (b.response_speak, {"session_id": "duplex-1", "epoch": 0, "response_id": "resp_1", "item_id": "item_resp_1"},
     "response.speak", {"response_id": "resp_1", "item_id": "item_resp_1", "output_index": 0, "content_index": 0,
                        "metadata": {"session_id": "duplex-1", "epoch": 0, "model_speak": True}}),
    (b.turn_event, {"session_id": "duplex-1", "event_name": "user_started", "turn_state": "user_speaking",
                    "epoch": 0}, "turn.event",
     {"session_id": "duplex-1", "event": "user_started", "turn_state": "user_speaking", "epoch": 0}),
    (b.item_added, {"previous_item_id": None, "item": ITEM}, "conversation.item.added",
     {"previous_item_id": None, "item": ITEM}),
    (b.item_created, {"previous_item_id": "item_0", "item": ITEM}, "conversation.item.created",
     {"previous_item_id": "item_0", "item": ITEM}),
    (b.item_done, {"previous_item_id": "item_0", "item": ITEM}, "conversation.item.done",
     {"previous_item_id": "item_0", "item": ITEM}),
    (b.item_retrieved, {"item": ITEM}, "conversation.item.retrieved", {"item": ITEM}),
    (b.item_deleted, {"session_id": "sess_1", "item_id": "item_1"}, "conversation.item.deleted",
     {"item_id": "item_1", "event": {"type": "conversation.item.deleted", "session_id": "sess_1",
                                     "item_id": "item_1", "deleted": True}}),
    (b.item_truncated, {"session_id": "sess_1", "item_id": "item_1", "audio_end_ms": 900},
     "conversation.item.truncated",
     {"item_id": "item_1", "content_index": 0, "audio_end_ms": 900,
      "event": {"type": "conversation.item.truncated", "session_id": "sess_1", "item_id": "item_1",
                "truncated": True}}),
    (b.input_transcription_completed, {"item_id": "item_1", "transcript": "hi", "audio_seconds": 1.5},
     "conversation.item.input_audio_transcription.completed",
     {"item_id": "item_1", "content_index": 0, "transcript": "hi", "usage": {"type": "duration", "seconds": 1.5}}),
    (b.response_created, {"response": RESPONSE}, "response.created", {"response_id": "resp_1", "response": RESPONSE}),
    (b.response_done, {"response": RESPONSE, "stage_metrics": {}, "playback": PLAYBACK, "committed": True,
                       "timing": {"first_audio_ms": 12.5}},
     "response.done", {"response_id": "resp_1", "response": RESPONSE,
                       "vllm_omni": {"stage_metrics": {}, "playback": PLAYBACK, "committed": True,
                                     "timing": {"first_audio_ms": 12.5}}}),
    (b.output_item_added, {"response_id": "resp_1", "item": ITEM}, "response.output_item.added",
     {"response_id": "resp_1", "output_index": 0, "item": ITEM}),
    (b.output_item_done, {"response_id": "resp_1", "item": ITEM}, "response.output_item.done",
     {"response_id": "resp_1", "output_index": 0, "item": ITEM}),
    (b.content_part_added, {**ADDR, "part": {"type": "audio", "transcript": ""}}, "response.content_part.added",
     {**ADDR, "part": {"type": "audio", "transcript": ""}}),
    (b.content_part_done, {**ADDR, "part": {"type": "text", "text": "hi"}}, "response.content_part.done",
     {**ADDR, "part": {"type": "text", "text": "hi"}}),
    (b.output_audio_delta, {**ADDR, "delta": "AAAA", "format": "pcm16", "sample_rate_hz": 24000,
                            "audio_duration_ms": 640, "playback": PLAYBACK, "session_id": "sess_1"},
     "response.output_audio.delta",
     {**ADDR, "delta": "AAAA", "vllm_omni": {"format": "pcm16", "sample_rate_hz": 24000, "audio_duration_ms": 640,
                                            "end_of_turn": False, "playback": PLAYBACK, "session_id": "sess_1"}}),
    (b.output_audio_done, ADDR, "response.output_audio.done", ADDR),
    (b.output_audio_transcript_delta, {**ADDR, "delta": "hi"}, "response.output_audio_transcript.delta",
     {**ADDR, "delta": "hi"}),
    (b.output_audio_transcript_done, {**ADDR, "transcript": "hi"}, "response.output_audio_transcript.done",
     {**ADDR, "transcript": "hi"}),
    (b.output_text_delta, {**ADDR, "delta": "hi"}, "response.output_text.delta", {**ADDR, "delta": "hi"}),
    (b.output_text_done, {**ADDR, "text": "hi"}, "response.output_text.done", {**ADDR, "text": "hi"}),
    (b.input_transcription_delta, {"item_id": "item_1", "delta": "Hel"},
     "conversation.item.input_audio_transcription.delta", {"item_id": "item_1", "content_index": 0, "delta": "Hel"}),
    (b.input_transcription_failed, {"item_id": "item_1", "code": "engine_error", "message": "no"},
     "conversation.item.input_audio_transcription.failed",
     {"item_id": "item_1", "content_index": 0, "error": {"type": "transcription_error", "code": "engine_error",
                                                         "message": "no", "param": None}}),
    (b.function_call_arguments_delta, CALL, "response.function_call_arguments.delta", CALL),
    (b.function_call_arguments_done, CALL_DONE, "response.function_call_arguments.done", CALL_DONE),
    (b.output_audio_buffer_cleared, {"response_id": None}, "output_audio_buffer.cleared", {"response_id": None}),
    (b.output_audio_buffer_started, {"response_id": "resp_1"}, "output_audio_buffer.started",
     {"response_id": "resp_1"}),
    (b.output_audio_buffer_stopped, {"response_id": "resp_1"}, "output_audio_buffer.stopped",
     {"response_id": "resp_1"}),
    (b.session_expired, {"session_id": "duplex-1", "reason": "disconnect_grace_expired"}, "session.expired",
     {"session_id": "duplex-1", "reason": "disconnect_grace_expired"}),
    (b.session_resumed, {"session_id": "duplex-1", "session": {}, "attachment_generation": 2, "resume_token": "t"},
     "session.resumed", {"session_id": "duplex-1", "session": {}, "attachment_generation": 2, "resume_token": "t"}),
    (b.session_replaced, {"session_id": "duplex-1", "attachment_generation": 1}, "session.replaced",
     {"session_id": "duplex-1", "attachment_generation": 1}),
    (b.playback_acknowledged, {"session_id": "sess_1", "epoch": 0, "item_id": "item_resp_1", "played_ms": 500,
                               "committed_ms": 400, "truncate": False, "playback": PLAYBACK,
                               "history_committed": False}, "playback.acknowledged",
     {"event": {"type": "playback.acknowledged", "session_id": "sess_1", "epoch": 0, "item_id": "item_resp_1",
                "played_ms": 500, "committed_ms": 400, "truncate": False, "playback": PLAYBACK,
                "history_committed": False}}),
]


@pytest.mark.parametrize(("build", "kwargs", "kind", "fields"), CASES,
                         ids=[f"{case[0].__name__}-{i}" for i, case in enumerate(CASES)])
def test_builder_wire_shape(build, kwargs: dict[str, Any], kind: str, fields: dict[str, Any]) -> None:
    wire = build(**kwargs)
    assert list(wire) == ["type", "event_id", *fields]  # JSON key order too
    assert wire["type"] == kind and wire["event_id"].startswith("event_")
    assert {key: wire[key] for key in fields} == fields


def test_every_event_kind_has_a_builder() -> None:
    kinds = {value for name, value in vars(server_event_types).items() if name.isupper()}
    built = {case[2] for case in CASES} | {session_created({}, "sess-1")["type"],
                                          error_event(ProtocolError("bad_event", "no"))["type"]}
    assert built == kinds


def test_event_ids_are_fresh_and_live_counters_are_copied() -> None:
    assert b.audio_buffer_cleared()["event_id"] != b.audio_buffer_cleared()["event_id"]
    playback = dict(PLAYBACK)
    delta = b.output_audio_delta(**ADDR, delta="", format="pcm16", sample_rate_hz=24000, audio_duration_ms=0,
                                 playback=playback, session_id="sess_1")
    playback["played_ms"] = 640  # the session keeps counting after the event is queued
    assert delta["vllm_omni"]["playback"]["played_ms"] == 0
