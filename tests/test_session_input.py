"""Turn session, input side, on the scripted engine: session.update, appends, commits, clear,
server VAD (real Silero on recorded speech), barge-in, the idle timer, input.cancel, text
appends, heartbeats."""

from __future__ import annotations

import asyncio

import pytest

from tests.ga_conformance import ga_problems
from tests.scripted_engine import Audio, Stall, Text, Wait, pcm16_b64, speech_appends, streamed_at_16k, turn_session
from vllm_omni.protocol.session_config import TurnDetection
from vllm_omni.session.base import SessionOptions

SERVER_VAD = {"type": "session.update", "session": {"audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {"type": "server_vad"}}}}}


def server_vad(**fields) -> dict:
    return {"type": "session.update", "session": {"audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {"type": "server_vad", **fields}}}}}


async def send_all(session, events: list[dict]) -> None:
    for ev in events:
        await session.handle(ev)


def append(seconds: float, amplitude: float = 0.1, **fields) -> dict:
    return {"type": "input_audio_buffer.append", "audio": pcm16_b64(seconds, amplitude), **fields}


# session.update ---------------------------------------------------------------------------------

async def test_session_update_echoes_and_a_wholly_bad_update_changes_nothing() -> None:
    session, _, events = turn_session()
    await session.handle({"type": "session.update", "session": {"instructions": "Be brief.", "voice": "Bruno"}})
    echoed = events.last("session.updated")["session"]
    assert echoed["instructions"] == "Be brief." and echoed["voice"] == "Bruno"
    assert echoed["id"] == "sess_test" and echoed["turn_state"] == "idle"
    await session.handle({"type": "session.update", "event_id": "u2", "session": {"temperature": 9}})
    assert events.kinds()[-1] == "error"  # nothing applied: no session.updated
    error = events.last("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("bad_event", "temperature", "u2")
    assert session.config.instructions == "Be brief." and session.config.temperature is None
    await session.handle({"type": "session.update", "model": "tiny"})  # flat spelling of the model
    assert events.kinds()[-1] == "session.updated"


async def test_a_partly_bad_update_reports_each_bad_group_then_applies_the_rest() -> None:
    """An agent framework's whole session.update with two unsupported values (§2.2)."""
    session, _, events = turn_session(extensions=False)
    await session.handle({"type": "session.update", "event_id": "u1", "session": {
        "type": "realtime", "instructions": "Be brief.", "output_modalities": ["audio"],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "required": "city"}}],
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                            "turn_detection": {"type": "push_to_talk"}},
                  "output": {"voice": "ethan", "speed": 1.5}}}})
    assert events.kinds() == ["error", "error", "session.updated"]
    errors = [e["error"] for e in events.of("error")]
    assert [(e["code"], e["param"], e["event_id"]) for e in errors] == [
        ("unsupported_turn_detection", "turn_detection", "u1"), ("invalid_value", "session.tools", "u1")]
    echoed = events.last("session.updated")["session"]
    assert (echoed["instructions"], echoed["audio"]["output"]["voice"], echoed["audio"]["output"]["speed"]) == \
        ("Be brief.", "ethan", 1.5)
    assert echoed["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000} and echoed["tools"] == []
    assert session.config.turn_detection is None
    assert [p for e in events for p in ga_problems(e)] == []


async def test_server_vad_fields_left_out_come_from_the_deploy_defaults() -> None:
    options = SessionOptions(served_models=["tiny"],
                             turn_detection_defaults={"threshold": 0.6, "silence_duration_ms": 800.0})
    session, _, events = turn_session(options=options)
    await session.handle(server_vad(prefix_padding_ms=100))
    td = events.last("session.updated")["session"]["audio"]["input"]["turn_detection"]
    assert (td["threshold"], td["silence_duration_ms"], td["prefix_padding_ms"]) == (0.6, 800.0, 100)
    await session.handle(server_vad(threshold=0.7))
    td = events.last("session.updated")["session"]["turn_detection"]
    assert (td["threshold"], td["silence_duration_ms"], td["prefix_padding_ms"]) == (0.7, 800.0, 300)
    plain, _, plain_events = turn_session()
    await plain.handle(SERVER_VAD)
    td = plain_events.last("session.updated")["session"]["turn_detection"]
    assert (td["threshold"], td["silence_duration_ms"], td["prefix_padding_ms"]) == (0.5, 500, 300)


async def test_changing_turn_detection_rebuilds_vad_and_drops_the_open_segment() -> None:
    session, engine, events = turn_session()
    await session.handle(SERVER_VAD)
    speech = speech_appends("speech_en_single.wav")
    await send_all(session, speech[:15])  # 1.5 s: speech has started, not stopped
    started = events.last("input_audio_buffer.speech_started")
    await session.handle({"type": "session.update", "session": {"instructions": "x"}})  # VAD untouched
    assert session.input.segment_item == started["item_id"]
    await session.handle(server_vad(silence_duration_ms=300))
    assert session.input.segment_item is None and session.input.turn_detection.silence_duration_ms == 300
    await session.handle({"type": "session.update", "session": {"turn_detection": None}})
    await send_all(session, speech_appends("speech_en_single.wav", trailing_silence_s=1.0))
    assert not events.of("input_audio_buffer.speech_stopped") and not engine.requests  # VAD is off


async def test_server_vad_unavailable_is_reported_and_manual_turns_still_work() -> None:
    options = SessionOptions(served_models=["tiny"], vad_model_path="/nonexistent/silero.onnx")
    session, _, events = turn_session(options=options)
    await session.handle(SERVER_VAD)
    assert events.errors() == ["server_vad_unavailable"]
    await session.handle(append(0.5))
    await session.handle({"type": "input_audio_buffer.commit"})
    assert events.kinds()[-1] == "conversation.item.done"


# Appends and commits ----------------------------------------------------------------------------

async def test_append_formats_rates_and_bad_audio() -> None:
    session, _, events = turn_session()
    await session.handle({"type": "input_audio_buffer.append", "delta": pcm16_b64(0.5, 0.1, rate=24000),
                          "sample_rate_hz": 24000})  # `delta` spelling, resampled to 16 kHz
    assert session.input.timeline == streamed_at_16k(0.5, 24000)
    await session.handle({"type": "input_audio_buffer.append", "event_id": "r", "audio": pcm16_b64(0.5)})
    assert events.last("error")["error"]["code"] == "bad_event"  # 16 kHz now: the rate is the session's
    await session.handle({"type": "input_audio_buffer.append", "audio": pcm16_b64(0.5, rate=24000),
                          "sample_rate_hz": 24000})
    assert session.input.timeline == streamed_at_16k(1.0, 24000)
    bad = [({"audio": "***"}, "bad_audio", "audio"), ({}, "missing_required_parameter", "audio"),
           ({"audio": pcm16_b64(0.1), "sample_rate_hz": 4000}, "bad_event", "sample_rate_hz"),
           ({"audio": pcm16_b64(0.1), "format": "mp3"}, "unsupported_audio_format", "input_audio_format"),
           ({"audio": pcm16_b64(0.1), "video_frames": ["x"]}, "bad_event", "video_frames")]
    for fields, code, param in bad:
        await session.handle({"type": "input_audio_buffer.append", "event_id": "a", **fields})
        error = events.last("error")["error"]
        assert (error["code"], error["param"], error["event_id"]) == (code, param, "a"), fields
    assert session.input.timeline == streamed_at_16k(1.0, 24000)  # refused appends added nothing


async def test_commit_fan_out_feeds_the_stream_and_carries_transcript_hints() -> None:
    session, engine, events = turn_session()
    await session.handle(append(0.3, transcript="hello"))
    await session.handle(append(0.2, transcript="there"))
    await session.handle({"type": "input_audio_buffer.commit", "create_response": True})
    start = events.kinds().index("conversation.item.added")
    assert events.kinds()[start:start + 6] == [
        "conversation.item.added", "conversation.item.created", "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed", "conversation.item.done", "response.created"]
    committed = events.last("input_audio_buffer.committed")
    assert committed["event"]["turn_id"] == 0 and committed["event"]["history_len"] == 1
    assert events.last("conversation.item.input_audio_transcription.completed")["transcript"] == "hello there"
    await events.wait("response.done")
    user = engine.requests[0].messages[-1]
    assert user.role == "user" and user.audio_stream.num_samples == 8000
    assert session.turn_id == 1


async def test_commit_needs_100_ms_and_keeps_a_short_buffer() -> None:
    session, _, events = turn_session()
    await session.handle({"type": "input_audio_buffer.commit", "event_id": "c1"})
    assert events.last("error")["error"]["message"].endswith("buffer only has 0.00ms of audio.")
    await session.handle(append(0.05))
    await session.handle({"type": "input_audio_buffer.commit"})
    assert "buffer only has 50.00ms" in events.last("error")["error"]["message"]
    await session.handle(append(0.05))
    await session.handle({"type": "input_audio_buffer.commit"})
    assert events.errors() == ["input_audio_buffer_commit_empty"] * 2 and events.of("input_audio_buffer.committed")


@pytest.mark.parametrize(("event", "responds"), [
    ({"type": "input_audio_buffer.commit"}, False),
    ({"type": "input_audio_buffer.commit", "response_create": True}, True),
    ({"type": "input.commit"}, True),  # the alias answers by default
    ({"type": "input.commit", "create_response": False}, False),
])
async def test_commit_spellings_and_their_response_default(event: dict, responds: bool) -> None:
    session, engine, events = turn_session()
    await session.handle(append(0.2))
    await session.handle(event)
    assert events.of("input_audio_buffer.committed")
    if responds:
        await events.wait("response.done")
    await asyncio.sleep(0)
    assert len(engine.requests) == int(responds)


async def test_clear_drops_uncommitted_input() -> None:
    session, _, events = turn_session()
    await session.handle(append(0.5))
    await session.handle({"type": "input_audio_buffer.clear"})
    assert events.kinds()[-1] == "input_audio_buffer.cleared"
    await session.handle({"type": "input_audio_buffer.commit"})
    assert events.errors() == ["input_audio_buffer_commit_empty"]


# Server VAD -------------------------------------------------------------------------------------

async def test_server_vad_turn_commits_and_answers() -> None:
    session, engine, events = turn_session()
    await session.handle(SERVER_VAD)
    await send_all(session, speech_appends("speech_en_single.wav", trailing_silence_s=1.5))
    await events.wait("response.done")
    kinds = events.kinds()
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "input_audio_buffer.committed", "response.created", "response.output_audio.delta", "response.done"]
    assert [kinds.index(k) for k in order] == sorted(kinds.index(k) for k in order)
    item_id = events.last("input_audio_buffer.speech_started")["item_id"]
    assert events.last("input_audio_buffer.speech_stopped")["item_id"] == item_id
    assert events.last("input_audio_buffer.committed")["item_id"] == item_id
    assert engine.requests[0].messages[-1].audio_stream.num_samples > 16000
    assert events.last("response.done")["response"]["status"] == "completed"


async def test_server_vad_without_create_response_only_commits() -> None:
    session, engine, events = turn_session()
    await session.handle(server_vad(create_response=False))
    await send_all(session, speech_appends("speech_en_single.wav", trailing_silence_s=1.5))
    assert events.of("input_audio_buffer.committed") and not events.of("response.created")
    assert not engine.requests


async def test_speech_barges_in_on_an_active_response() -> None:
    session, engine, events = turn_session()
    engine.script(Text("long answer"), Stall())
    await session.handle(server_vad(interrupt_response=True))
    await send_all(session, speech_appends("speech_en_single.wav", trailing_silence_s=1.0))
    first = (await events.wait("response.created"))["response"]["id"]
    await events.wait("response.output_audio_transcript.delta")  # the engine is generating
    await send_all(session, speech_appends("speech_with_pause.wav", trailing_silence_s=1.0))
    done = await events.wait("response.done")
    assert done["response"]["id"] == first and done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    decision = events.last("overlap.decision")
    assert (decision["action"], decision["epoch"]) == ("barge_in", 0) and session.responses.epoch == 1
    await asyncio.sleep(0)  # the abort is sent from a task of its own
    assert engine.aborted == [engine.requests[0].request_id]
    second = await events.wait("response.done", count=2)
    assert second["response"]["status"] == "completed" and second["response"]["id"] != first


async def test_a_turn_during_an_answer_is_answered_after_it() -> None:
    session, engine, events = turn_session()
    engine.script(Text("first"), Wait(0.3), Audio(100))
    await session.handle(SERVER_VAD)
    await send_all(session, speech_appends("speech_en_single.wav", trailing_silence_s=1.0))
    await send_all(session, speech_appends("speech_with_pause.wav", trailing_silence_s=1.0))
    committed = events.of("input_audio_buffer.committed")
    assert len(committed) == 2 and committed[1]["event"]["response_create_deferred"] is True
    assert len(events.of("response.created")) == 1  # deferred, not refused
    second = await events.wait("response.done", count=2)
    assert second["response"]["status"] == "completed" and len(engine.requests) == 2


async def test_idle_timeout_commits_an_empty_turn_after_the_answer_played() -> None:
    session, engine, events = turn_session()
    await session.handle(server_vad(idle_timeout_ms=50))
    await send_all(session, speech_appends("speech_en_single.wav", trailing_silence_s=1.5))
    first_done = await events.wait("response.done")
    played_ms = first_done["response"]["output"][0]["content"][0]["audio_duration_ms"]
    assert played_ms == 200
    timeout = await events.wait("input_audio_buffer.timeout_triggered", timeout=2)
    after = events.kinds(events.index(timeout))
    assert after[:4] == ["input_audio_buffer.timeout_triggered", "conversation.item.added",
                         "conversation.item.created", "input_audio_buffer.committed"]
    assert events.last("input_audio_buffer.committed")["item_id"] == timeout["item_id"]
    await events.wait("response.done", count=2)
    assert len(engine.requests) == 2 and engine.requests[1].messages[-1].audio_stream is not None


async def test_idle_timer_waits_while_a_response_is_active() -> None:
    session, engine, events = turn_session(turn_detection=TurnDetection(idle_timeout_ms=0))
    engine.script(Stall())
    session.input.arm_idle_timer(0)
    await session.handle(append(0.2))
    await session.handle({"type": "input.commit"})  # a response starts: the timer is disarmed
    await asyncio.sleep(0.05)
    assert not events.of("input_audio_buffer.timeout_triggered")
    session.input.arm_idle_timer(0)
    await asyncio.sleep(0.05)  # fires, but a response is active: nothing happens
    assert not events.of("input_audio_buffer.timeout_triggered")
    await session.close()


# Cancel, text, heartbeat, unknown events -----------------------------------------------------------

@pytest.mark.parametrize("kind", ["input.cancel", "barge_in"])
async def test_input_cancel_stops_the_answer_or_clears_the_buffer(kind: str) -> None:
    session, engine, events = turn_session()
    await session.handle(append(0.3))
    await session.handle({"type": kind})
    assert events.kinds()[-1] == "input_audio_buffer.cleared"
    engine.script(Stall())
    await session.handle(append(0.3))
    await session.handle({"type": "input.commit"})
    await events.wait("response.created")
    await session.handle({"type": kind})
    await asyncio.sleep(0)  # the abort is sent from a task of its own
    done = events.last("response.done")["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "barge_in")
    assert events.kinds().count("input_audio_buffer.cleared") == 1 and engine.aborted


@pytest.mark.parametrize("kind", ["input.text.append", "input_text.append", "push_text"])
async def test_text_append_points_to_conversation_items(kind: str) -> None:
    session, _, events = turn_session()
    await session.handle({"type": kind, "text": "hi"})
    await session.handle({"type": kind})
    assert events.errors() == ["native_text_append_unsupported", "missing_required_parameter"]


async def test_heartbeat_unknown_events_and_session_close_are_answered() -> None:
    session, _, events = turn_session()
    await session.handle({"type": "session.heartbeat"})
    assert events.last("session.heartbeat_ack")["session_id"] == "sess_test"
    await session.handle({"type": "input_audio_buffer.frobnicate", "event_id": "x"})
    await session.handle({"type": "session.close"})  # the connection's to handle, not the session's
    assert events.errors() == ["unknown_event", "unknown_event"]
    assert events.of("error")[0]["error"]["event_id"] == "x"
