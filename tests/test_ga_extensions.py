"""Extensions on request, on the scripted engine: a session that did not ask for them receives
only pure-GA events (each checked against the `openai` SDK's GA models), one that did gets the
[EXT] events and fields; `metadata` and `response.create` per GA (docs/realtime-api.md §1.3, §4.8)."""

from __future__ import annotations

import pytest

from tests.ga_conformance import ga_problems
from tests.scripted_engine import (
    Audio,
    Events,
    Finish,
    ScriptedEngine,
    Stall,
    Text,
    pcm16_b64,
    speech_appends,
    streamed_at_16k,
    turn_session,
)
from vllm_omni.audio.formats import AudioFormat
from vllm_omni.engine.request import FinishReason
from vllm_omni.protocol.ga_view import wants_extensions
from vllm_omni.session.base import SessionOptions
from vllm_omni.session.factory import SessionFactory

QUESTION = {"type": "conversation.item.create", "item": {
    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi?"}]}}
SERVER_VAD = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {"type": "server_vad",
                                                                         "interrupt_response": True}}}}}
EXTENSION_EVENTS = {"session.heartbeat_ack", "playback.acknowledged", "overlap.decision", "session.closed"}


def assert_pure_ga(events: Events) -> None:
    assert [problem for event in events for problem in ga_problems(event)] == []


async def a_bit_of_everything(extensions: bool) -> Events:
    """Every kind of exchange the turn session has, on one session."""
    session, engine, events = turn_session(extensions=extensions)
    await session.handle({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.",
                                                                "audio": {"output": {"format": "wav"}}}})
    await session.handle({"type": "response.create", "response": {"metadata": {"purpose": "greeting"}}})
    await events.wait("response.done")
    await session.handle({"type": "input_audio_buffer.append", "audio": pcm16_b64(0.3, 0.1),
                          "transcript": "hello"})
    await session.handle({"type": "input_audio_buffer.commit", "create_response": True})
    done = (await events.wait("response.done", 2))["response"]
    await session.handle({"type": "playback.ack", "response_id": done["id"], "played_ms": 100})
    await session.handle({"type": "session.heartbeat"})
    await session.handle({"type": "conversation.item.truncate", "item_id": done["output"][0]["id"],
                          "audio_end_ms": 50})
    await session.handle(QUESTION)
    await session.handle({"type": "response.create", "response": {"output_modalities": ["text"],
                                                                  "conversation": "none"}})
    await events.wait("response.done", 3)
    engine.script(Text("a"), Audio(100), Stall())
    await session.handle({"type": "response.create"})
    await events.wait("response.output_audio.delta", 5)
    await session.handle({"type": "input.cancel"})
    engine.script(Text("a"), Stall())
    await session.handle({"type": "response.create"})
    await events.wait("response.output_audio_transcript.delta", 6)
    await session.handle({"type": "output_audio_buffer.clear"})
    engine.script(Finish(FinishReason.ERROR, error="died", error_code="stage_unavailable"))
    await session.handle({"type": "response.create"})
    await events.wait("response.done", 6)
    await session.handle({"type": "conversation.item.retrieve", "item_id": done["output"][0]["id"]})
    await session.handle({"type": "conversation.item.delete", "item_id": done["output"][0]["id"]})
    await session.handle({"type": "response.cancel"})
    await session.handle({"type": "output_audio_buffer.clear", "response_id": "resp_gone"})
    await session.handle(SERVER_VAD)  # the second speech barges in on the answer to the first
    for append in speech_appends("speech_en_single.wav", 1.0) + speech_appends("speech_en_single.wav", 1.0):
        await session.handle(append)
    await events.wait("response.done", 8)
    await session.close()
    return events


async def test_without_extensions_every_event_is_pure_ga() -> None:
    events = await a_bit_of_everything(extensions=False)
    assert_pure_ga(events)
    kinds = set(events.kinds())
    assert {"input_audio_buffer.speech_started", "conversation.item.truncated", "conversation.item.retrieved",
            "conversation.item.deleted", "output_audio_buffer.cleared", "error"} <= kinds
    assert not kinds & EXTENSION_EVENTS
    reasons = [e["response"]["status_details"] for e in events.of("response.done")[3:7]]
    assert [r.get("reason") for r in reasons] == ["client_cancelled", "client_cancelled", None, "turn_detected"]
    assert reasons[2]["error"]["code"] == "stage_unavailable"
    assert events.of("response.done")[0]["response"]["metadata"] == {"purpose": "greeting"}
    assert events.errors() == ["stage_unavailable", "response_cancel_not_active"]


async def test_with_extensions_the_same_session_carries_its_extension_fields() -> None:
    events = await a_bit_of_everything(extensions=True)
    assert EXTENSION_EVENTS - {"session.closed"} <= set(events.kinds())  # session.closed is the connection's
    done = events.of("response.done")[1]
    assert done["response"]["metadata"] is None  # client metadata only, in both modes
    assert set(done["vllm_omni"]) == {"stage_metrics", "playback", "committed", "timing"}
    assert done["vllm_omni"]["committed"]
    assert done["vllm_omni"]["timing"]["engine_request_ms"] <= done["vllm_omni"]["timing"]["first_audio_ms"]
    delta = events.of("response.output_audio.delta")[0]
    assert (delta["vllm_omni"]["format"], delta["vllm_omni"]["sample_rate_hz"]) == ("wav", 24000)
    assert events.of("input_audio_buffer.committed")[0]["event"]["type"] == "input.committed"
    assert events.of("response.done")[3]["response"]["status_details"]["reason"] == "barge_in"
    assert events.of("output_audio_buffer.cleared")[-1]["response_id"] is None


async def test_extension_client_events_still_apply_without_their_replies() -> None:
    session, engine, events = turn_session(extensions=False)
    await session.handle(QUESTION)
    await session.handle({"type": "response.create"})
    done = (await events.wait("response.done"))["response"]
    before = len(events)
    await session.handle({"type": "playback.ack", "response_id": done["id"], "played_ms": 150, "truncate": True})
    await session.handle({"type": "session.heartbeat"})
    assert len(events) == before and session.responses.last_response.playback["played_ms"] == 150
    assert session.items.get(done["output"][0]["id"]).kept_text == "Hello the"  # 150 of 200 ms


@pytest.mark.parametrize(("session_update", "echo"), [
    ({}, {"type": "audio/pcm", "rate": 24000}),  # GA's default
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, None),  # GA cannot say 16 kHz
    ({"input_audio_format": "g711_ulaw"}, {"type": "audio/pcmu"}),
    ({"input_audio_format": "pcm_f32le"}, None),
])
async def test_the_input_format_echo_is_ga_or_absent(session_update: dict, echo: dict | None) -> None:
    session, _, events = turn_session(extensions=False, input_format=AudioFormat("pcm16", 24000))
    await session.handle({"type": "session.update", "session": {"type": "realtime", **session_update}})
    updated = events.last("session.updated")
    assert ga_problems(updated) == [] and updated["session"]["audio"]["input"].get("format") == echo
    assert updated["session"]["output_modalities"] == ["audio"]  # GA's name for audio with its transcript


async def test_a_session_without_its_own_rate_hears_24_khz() -> None:
    session, _, events = turn_session(input_format=AudioFormat("pcm16", 24000))
    await session.handle({"type": "input_audio_buffer.append", "audio": pcm16_b64(0.3, 0.1, rate=24000)})
    heard = streamed_at_16k(0.3, 24000)
    assert 4800 - 16 * 5 < heard < 4800 and session.input.timeline == heard  # 0.3 s at 16 kHz, less < 5 ms held
    await session.handle({"type": "input_audio_buffer.append", "audio": pcm16_b64(0.3, 0.1),
                          "sample_rate_hz": 16000})  # a rate of its own: not within one session
    assert events.last("error")["error"]["code"] == "bad_event" and session.input.timeline == heard


async def test_the_factory_greets_in_pure_ga_and_leaves_the_legacy_lane_its_vocabulary() -> None:
    factory = SessionFactory(ScriptedEngine(), SessionOptions(served_models=["tiny"]))
    events = Events()
    session = factory.route(duplex_endpoint=False, duplex_query=None)("tiny", events.append, False)
    assert ga_problems(events[0]) == [] and "id" not in events[0]
    await session.handle({"type": "session.update", "model": "tiny"})
    await session.handle({"type": "input_audio_buffer.commit", "final": False})
    await session.handle({"type": "input_audio_buffer.append", "audio": pcm16_b64(0.2, 0.1)})
    await session.handle({"type": "input_audio_buffer.commit", "final": True})
    await events.wait("response.output_audio.done")
    assert events.kinds()[1:] == ["transcription.delta", "response.output_audio.delta", "transcription.delta",
                                  "response.output_audio.delta", "transcription.done", "response.output_audio.done"]


@pytest.mark.parametrize(("extensions", "turn_detection"), [(False, "server_vad"), (True, None)])
def test_a_ga_session_starts_with_server_vad_as_in_ga(extensions: bool, turn_detection: str | None) -> None:
    """GA's default; a session that asked for our extensions starts with manual turns (as before)."""
    options = SessionOptions(served_models=["tiny"], turn_detection_defaults={"silence_duration_ms": 650.0})
    events = Events()
    SessionFactory(ScriptedEngine(), options).route(duplex_endpoint=False, duplex_query=None)(
        "tiny", events.append, extensions)
    echoed = events[0]["session"]["audio"]["input"]["turn_detection"]
    assert (echoed or {}).get("type") == turn_detection
    if echoed:
        assert echoed["silence_duration_ms"] == 650  # the deploy's defaults


@pytest.mark.parametrize(("query", "asked"), [(None, False), ("", False), ("other", False),
                                              ("vllm_omni", True), ("other, vllm_omni", True)])
def test_the_extensions_query(query: str | None, asked: bool) -> None:
    assert wants_extensions(query) is asked


# metadata and response.create per GA ---------------------------------------------------------------

@pytest.mark.parametrize(("metadata", "param"), [
    ({"n": 1}, "response.metadata.n"), ({"k": "v" * 513}, "response.metadata.k"),
    ({str(i): "v" for i in range(17)}, "response.metadata"), ({"k" * 65: "v"}, f"response.metadata.{'k' * 65}.[key]"),
])
async def test_metadata_is_ga_strings_or_refused(metadata: dict, param: str) -> None:
    session, _, events = turn_session()
    await session.handle({"type": "response.create", "event_id": "m", "response": {"metadata": metadata}})
    error = events.last("error")["error"]
    assert (error["code"], error["event_id"], error["param"]) == ("bad_event", "m", param)
    assert not events.of("response.created")


async def test_metadata_is_echoed_as_given_and_the_session_default_applies() -> None:
    session, _, events = turn_session(metadata={"from": "session"})
    await session.handle({"type": "response.create"})
    await session.handle({"type": "response.create", "response": {"metadata": {"from": "response"}}})
    await events.wait("response.done")
    await session.handle({"type": "response.create", "response": {"metadata": {"from": "response"}}})
    await events.wait("response.done", 2)
    echoes = [e["response"]["metadata"] for e in events if e["type"] in ("response.created", "response.done")]
    assert echoes == [{"from": "session"}] * 2 + [{"from": "response"}] * 2
    assert events.errors() == ["conversation_already_has_active_response"]


async def test_response_input_answers_its_own_items_outside_the_conversation() -> None:
    session, engine, events = turn_session(extensions=False)
    await session.handle(QUESTION)
    question = events.last("conversation.item.done")["item"]["id"]
    before = len(events)
    await session.handle({"type": "response.create", "response": {"conversation": "none", "input": [
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Summarise."}]},
        {"type": "item_reference", "id": question},
        {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": pcm16_b64(0.2, 0.1)}]}]}})
    done = (await events.wait("response.done"))["response"]
    request = engine.requests[0]
    assert [(m.role, m.text) for m in request.messages] == [("system", "Summarise."), ("user", "Hi?"), ("user", None)]
    assert request.messages[2].audio_stream.num_samples == 3200
    assert not [e for e in events[before:] if e["type"].startswith("conversation.item.")]  # out of band
    assert done["conversation_id"] is None and [i.id for i in session.items.conversation.items] == [question]
    await session.handle({"type": "response.create", "event_id": "r",
                          "response": {"input": [{"type": "item_reference", "id": "item_nope"}]}})
    error = events.last("error")["error"]
    assert (error["code"], error["param"]) == ("item_not_found", "response.input.0.id")


async def test_an_empty_input_answers_the_instructions_alone() -> None:
    session, engine, events = turn_session()
    await session.handle(QUESTION)
    await session.handle({"type": "response.create", "response": {"input": [], "instructions": "Say hi."}})
    await events.wait("response.done")
    assert [(m.role, m.text) for m in engine.requests[0].messages] == [("system", "Say hi."), ("user", " ")]
