"""The duplex lane's session on the scripted engine (docs/realtime-api.md §13): how it opens
(autostart, the first message, and every handshake failure), its defaults, atomic updates,
open-time fields and its spelling of error codes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.scripted_engine import Audio, Events, ScriptedEngine, Text, Wait, pcm16_b64
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.states import Lane, SessionMode
from vllm_omni.server.duplex_handshake import (
    CONFIG_TIMEOUT_S,
    Handshake,
    ResumeRequest,
    autostart,
    close_code,
    first_message,
)
from vllm_omni.session.base import SessionOptions
from vllm_omni.session.factory import open_duplex_session
from vllm_omni.session.resume_journal import ResumeRefused
from vllm_omni.session.session import Session

OPTIONS = SessionOptions(served_models=["tiny"], session_mode=SessionMode.DUPLEX, max_sessions=8)


def opened(opening: dict[str, Any] | None = None) -> tuple[Session, Events]:
    session, _, events = opened_on_engine(opening)
    return session, events


def opened_on_engine(opening: dict[str, Any] | None = None) -> tuple[Session, ScriptedEngine, Events]:
    events, engine = Events(), ScriptedEngine()
    return open_duplex_session(engine, OPTIONS, opening or {}, "tiny", events.append), engine, events


def refused(opening: dict[str, Any]) -> ProtocolError:
    with pytest.raises(ProtocolError) as problem:
        opened(opening)
    return problem.value


def test_opening_greets_twice_with_the_duplex_defaults() -> None:
    session, events = opened({"model": "tiny", "overlap_policy": "listen_only", "idle_timeout_s": 60,
                              "turn_detection": {"type": "server_vad"}})
    assert events.kinds() == ["session.created", "session.updated"]
    created, updated = events
    assert created["session"] == updated["session"] and session.lane is Lane.DUPLEX
    shown = created["session"]
    assert shown["id"].startswith("duplex-") and len(shown["id"]) == len("duplex-") + 32
    assert shown["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    assert shown["overlap_policy"] == "listen_only" and shown["turn_detection"]["interrupt_response"] is False
    assert shown["capabilities"]["chunk_period_ms"] == 1000 and shown["capabilities"]["supports_multi_session"]
    assert session.idle_timeout_s == 60


def test_without_turn_detection_speech_is_committed_by_the_client_and_barge_in_is_the_default() -> None:
    session, events = opened()
    assert session.config.turn_detection is None
    session, _ = opened({"turn_detection": {"type": "server_vad"}})
    assert session.config.turn_detection.interrupt_response is True


@pytest.mark.parametrize(("opening", "code", "param"), [
    ({"model": "other"}, "model_not_found", "model"),
    ({"input_audio_format": "mp3"}, "invalid_session_config", "audio.input.format"),
    ({"turn_detection": {"type": "push_to_talk"}}, "invalid_session_config", "turn_detection"),
    ({"temperature": "hot"}, "invalid_session_config", "temperature"),
    ({"ref_audio": "data:audio/wav;base64,AAAA"}, "invalid_duplex_runtime_config", "ref_audio"),
    ({"ref_audio_path": "/tmp/voice.wav"}, "unsupported_ref_audio_path", "ref_audio_path"),
    ({"extra_body": {"auto_response": True}}, "invalid_session_config", "extra_body"),
])
def test_an_opening_that_cannot_open_a_session_is_refused(opening: dict, code: str, param: str) -> None:
    problem = refused(opening)
    assert (problem.code, problem.param) == (code, param)
    assert close_code(problem) == 1008


async def test_updates_are_atomic_and_open_time_fields_stay() -> None:
    session, events = opened({"instructions": "first", "idle_timeout_s": 30})
    await session.handle({"type": "session.update", "event_id": "u1",
                          "session": {"instructions": "second", "input_audio_format": "mp3"}})
    error = events.last("error")["error"]
    assert (error["code"], error["event_id"]) == ("unsupported_audio_format", "u1")
    assert session.config.instructions == "first" and events.kinds()[-1] == "error"
    await session.handle({"type": "session.update", "session": {"ref_audio": "data:audio/wav;base64,AAAA"}})
    assert events.errors()[-1] == "ref_audio_update_unsupported"
    await session.handle({"type": "session.update", "session": {"instructions": "second", "idle_timeout_s": 5}})
    assert session.config.instructions == "second" and session.idle_timeout_s == 30
    assert events.kinds()[-1] == "session.updated"


@pytest.mark.parametrize(("event", "code"), [
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_empty"),
    ({"type": "response.cancel"}, "response_not_active"),
    ({"type": "conversation.item.delete", "item_id": "item_nope"}, "item_not_found"),
    ({"type": "conversation.item.delete"}, "missing_item_id"),
])
async def test_errors_use_the_duplex_spelling(event: dict, code: str) -> None:
    session, events = opened()
    await session.handle(event)
    assert events.errors() == [code]


async def test_a_response_needs_new_input() -> None:
    session, events = opened()
    await session.handle({"type": "response.create", "event_id": "r1"})
    error = events.last("error")["error"]
    assert (error["code"], error["event_id"]) == ("response_create_without_input", "r1")
    await session.handle({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi?"}]}})
    await session.handle({"type": "response.create"})
    await events.wait("response.done")
    await session.handle({"type": "response.create"})  # answered already: nothing new
    assert events.errors() == ["response_create_without_input"] * 2


async def test_the_voice_is_fixed_once_the_session_has_spoken() -> None:
    session, events = opened({"voice": "aria"})
    await session.handle({"type": "session.update", "session": {"voice": "bruno"}})  # nothing spoken yet
    assert session.config.voice == "bruno" and not events.errors()
    await session.handle(speech(0.5))
    await session.handle({"type": "input_audio_buffer.commit"})
    await session.handle({"type": "response.create"})
    await events.wait("response.done")
    await session.handle({"type": "session.update", "session": {"audio": {"output": {"voice": "aria"}}}})
    await session.handle({"type": "session.update", "session": {"voice": "bruno", "instructions": "Be brief."}})
    assert events.errors() == ["voice_update_after_audio_unsupported"]
    assert session.config.voice == "bruno" and session.config.instructions == "Be brief."


async def test_at_most_four_committed_turns_wait_for_an_answer() -> None:
    session, events = opened()
    for _ in range(4):
        await session.handle(speech(0.5))
        await session.handle({"type": "input_audio_buffer.commit"})
    await session.handle(speech(0.5))
    await session.handle({"type": "input_audio_buffer.commit"})
    assert events.errors() == ["input_backpressure"] and len(events.of("input_audio_buffer.committed")) == 4
    await session.handle({"type": "response.create"})
    await events.wait("response.done")
    await session.handle({"type": "input_audio_buffer.commit"})  # the kept buffer commits now
    assert len(events.of("input_audio_buffer.committed")) == 5


# The playback ledger (docs/realtime-api.md §13.5) ------------------------------------------------

async def answered(policy: str) -> tuple[Session, ScriptedEngine, Events, str]:
    events, engine = Events(), ScriptedEngine()
    session = open_duplex_session(engine, OPTIONS, {"playback_commit_policy": policy}, "tiny", events.append)
    await session.handle({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi?"}]}})
    await session.handle({"type": "response.create"})
    done = (await events.wait("response.done"))["response"]
    return session, engine, events, done["id"]


async def history_text(session: Session, events: Events, response_id: str) -> str:
    await session.handle({"type": "conversation.item.retrieve", "item_id": f"item_{response_id}"})
    return events.last("conversation.item.retrieved")["item"]["content"][0]["transcript"]


async def test_ack_only_keeps_the_answer_out_of_the_history_until_acks_cover_its_audio() -> None:
    session, engine, events, response_id = await answered("ack_only")
    audio_ms = session.items.get(f"item_{response_id}").audio_duration_ms
    assert session.session_object()["playback_commit_policy"] == "ack_only" and audio_ms > 0
    assert events.last("response.done")["vllm_omni"]["committed"] is False
    assert await history_text(session, events, response_id) == ""
    await session.handle({"type": "playback.ack", "response_id": response_id, "played_ms": audio_ms // 2})
    assert events.last("playback.acknowledged")["event"]["history_committed"] is False
    assert await history_text(session, events, response_id) == ""
    await session.handle({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "And?"}]}})
    await session.handle({"type": "response.create"})  # the unheard answer is not in the next prompt
    await events.wait("response.done", count=2)
    assert [m.role for m in engine.requests[1].messages] == ["user", "user"]
    await session.handle({"type": "playback.ack", "response_id": response_id, "played_ms": audio_ms})
    assert events.last("playback.acknowledged")["event"]["history_committed"] is True
    assert await history_text(session, events, response_id) == "Hello there."


async def test_commit_all_on_done_writes_the_answer_when_it_completes() -> None:
    session, _, events, response_id = await answered("commit_all_on_done")
    assert events.last("response.done")["vllm_omni"]["committed"] is True
    assert await history_text(session, events, response_id) == "Hello there."


async def test_an_unknown_playback_policy_refuses_the_opening() -> None:
    assert refused({"playback_commit_policy": "sometimes"}).code == "invalid_session_config"


# Input while an answer generates (docs/realtime-api.md §13.6) -------------------------------------

def speech(seconds: float, **fields) -> dict:
    return {"type": "input_audio_buffer.append", "audio": pcm16_b64(seconds, 0.1), **fields}


async def answering(**opening) -> tuple[Session, ScriptedEngine, Events]:
    """A session whose answer is still generating (it waits 1 s between two audio chunks)."""
    events, engine = Events(), ScriptedEngine()
    engine.script(Text("Sure."), Audio(100), Wait(1.0), Audio(100))
    session = open_duplex_session(engine, OPTIONS, opening, "tiny", events.append)
    await session.handle(speech(0.5))
    await session.handle({"type": "input_audio_buffer.commit"})
    await session.handle({"type": "response.create"})
    await events.wait("response.output_audio.delta")
    return session, engine, events


async def test_idle_silence_is_left_out_of_the_turn_but_not_off_the_clock() -> None:
    """docs/realtime-api.md §13.6: without server VAD, silence while idle is not kept (one
    `response.listen` each); the turn holds the speech only and is answered, and the speech
    events keep the client's clock, silence included."""
    session, engine, events = opened_on_engine()
    silence = {"type": "input_audio_buffer.append", "audio": pcm16_b64(0.3)}
    for append in (silence, speech(0.5), silence, speech(0.2), silence):
        await session.handle(append)
    assert [e["response"]["metadata"]["reason"] for e in events.of("response.listen")] == ["silence_or_noise"] * 3
    await session.handle({"type": "input_audio_buffer.commit", "create_response": True})
    committed = events.last("input_audio_buffer.committed")
    assert session.items.get(committed["item_id"]).audio_ms == 700 and "empty" not in committed["event"]
    assert (events.last("input_audio_buffer.speech_started")["audio_start_ms"],
            events.last("input_audio_buffer.speech_stopped")["audio_end_ms"]) == (300, 1600)
    await events.wait("response.done")
    await session.handle(speech(0.2))
    assert events.last("input_audio_buffer.speech_started")["audio_start_ms"] == 1600
    assert not events.errors() and len(engine.requests) == 1


async def test_a_second_response_waits_for_the_first() -> None:
    session, engine, events = await answering()
    await session.handle({"type": "response.create", "event_id": "again"})
    error = events.last("error")["error"]
    assert (error["code"], error["event_id"]) == ("response_already_active", "again")
    await events.wait("response.done")
    assert len(engine.requests) == 1


async def test_speech_over_an_answer_is_kept_and_answered_after_it_under_listen_only() -> None:
    session, engine, events = await answering(overlap_policy="listen_only")
    await session.handle(speech(1.0))
    decision = events.last("overlap.decision")
    assert (decision["action"], decision["reason"], decision["metadata"]["buffer_audio"]) == \
        ("listen", "policy_listen_only", True)
    await session.handle({"type": "input_audio_buffer.commit", "create_response": True})
    assert events.last("input_audio_buffer.committed")["event"]["overlap_deferred"] is True
    second = (await events.wait("response.done", count=2))["response"]
    assert [e["response"]["status"] for e in events.of("response.done")] == ["completed", "completed"]
    assert second["status"] == "completed" and len(engine.requests) == 2


async def test_a_short_back_channel_over_an_answer_starts_no_turn() -> None:
    session, engine, events = await answering()
    await session.handle(speech(0.4))
    await session.handle({"type": "input_audio_buffer.commit", "create_response": True})
    committed = events.last("input_audio_buffer.committed")
    assert {k: committed["event"].get(k) for k in ("empty", "overlap_ack", "no_response")} == \
        dict.fromkeys(("empty", "overlap_ack", "no_response"), True)
    await events.wait("response.done")
    await asyncio.sleep(0.1)
    assert len(events.of("response.created")) == 1 and len(engine.requests) == 1
    assert session.items.get(committed["item_id"]).to_wire()["content"] == []


@pytest.mark.parametrize(("fields", "action", "reason", "kept"), [
    ({"overlap_action": "drop"}, "drop", "client_overlap_action", False),
    ({"force_listen": True}, "listen", "client_force_listen", True),
    ({"transcript": "Yeah."}, "listen", "short_ack_transcript", False),
    ({"is_speech": False}, "drop", "silence_or_noise", False),
])
async def test_each_append_over_an_answer_gets_one_decision(fields: dict, action: str, reason: str,
                                                            kept: bool) -> None:
    session, _, events = await answering()
    timeline = session.input.timeline
    await session.handle(speech(0.2, **fields))
    decision = events.last("overlap.decision")
    assert (decision["action"], decision["reason"]) == (action, reason)
    assert session.input.timeline == timeline + (3200 if kept else 0)
    assert not events.of("response.done")  # the answer goes on


@pytest.mark.parametrize("fields", [{"force_barge_in": True}, {"overlap_action": "interrupt"}])
async def test_a_client_barge_in_cancels_the_answer_and_keeps_the_speech(fields: dict) -> None:
    session, _, events = await answering()
    timeline = session.input.timeline
    await session.handle(speech(0.2, **fields))
    assert events.last("overlap.decision")["action"] == "barge_in"
    done = (await events.wait("response.done"))["response"]
    assert done["status"] == "cancelled" and session.input.timeline == timeline + 3200


# The handshake ----------------------------------------------------------------------------------

def first_messages(*texts: str | None):
    """A client that sends `texts` (None: a binary frame) and then nothing."""
    queue = list(texts)

    async def first_text(timeout: float) -> str | None:
        assert timeout == CONFIG_TIMEOUT_S
        if not queue:
            raise TimeoutError
        return queue.pop(0)

    return first_text


async def handshake(query: dict[str, str], *texts: str | None) -> Handshake:
    return autostart(query) or await first_message(query, first_messages(*texts))


async def test_autostart_opens_with_the_model_in_the_url() -> None:
    assert await handshake({"model": "tiny"}) == Handshake(opening={"model": "tiny"})


@pytest.mark.parametrize("query", [{"model": "tiny", "autostart": "0"}, {"model": "tiny", "resume": "yes"}, {}])
async def test_otherwise_the_first_session_update_opens(query: dict[str, str]) -> None:
    update = {"type": "session.update", "session": {"instructions": "Be brief.", "modalities": ["text"]}}
    assert await handshake(query, json.dumps(update)) == Handshake(opening=update["session"])


async def test_a_top_level_flat_update_is_its_own_session_object() -> None:
    flat = {"type": "session.update", "event_id": "e1", "model": "tiny", "instructions": "flat"}
    assert (await handshake({}, json.dumps(flat))).opening == {"model": "tiny", "instructions": "flat"}


async def test_any_other_first_event_opens_a_default_session_then_is_handled() -> None:
    append = {"type": "input_audio_buffer.append", "audio": pcm16_b64(0.2, 0.1)}
    opened_by = await handshake({"autostart": "off"}, json.dumps(append))
    assert opened_by == Handshake(opening={"model": None}, first=append)
    session, events = opened(opened_by.opening)
    await session.handle(opened_by.first)
    assert session.input.timeline == 3200  # and, as it sounds like speech, without VAD: speech_started
    assert events.kinds() == ["session.created", "session.updated", "input_audio_buffer.speech_started"]


async def test_a_resume_names_the_session_its_token_and_the_last_event_seen() -> None:
    resume = {"type": "session.resume", "session_id": "duplex-1", "resume_token": "t",
              "last_received_server_event_seq": 7}
    assert (await handshake({"resume": "1"}, json.dumps(resume))).resume == ResumeRequest("duplex-1", "t", 7)
    for bad in ({"session_id": "duplex-1"}, {"session_id": "duplex-1", "resume_token": "t",
                                              "last_received_server_event_seq": -1}):
        with pytest.raises(ResumeRefused) as refused:
            await handshake({}, json.dumps({"type": "session.resume", **bad}))
        assert refused.value.event["error"]["code"] == "invalid_session_resume"


@pytest.mark.parametrize(("query", "texts", "code"), [
    ({}, (), "config_timeout"),
    ({}, ("{not json",), "invalid_json"),
    ({}, ("[1, 2]",), "bad_event"),
    ({}, (None,), "bad_event"),
    ({"autostart": "sometimes"}, (), "bad_event"),
    ({}, ('{"type": "session.update", "session": [1]}',), "invalid_session_config"),
])
async def test_every_handshake_failure_is_one_fatal_error(query: dict, texts: tuple, code: str) -> None:
    with pytest.raises(ProtocolError) as problem:
        await handshake(query, *texts)
    assert problem.value.code == code and close_code(problem.value) == 1008


async def test_a_session_ends_with_its_work() -> None:
    session, _ = opened({"model": "tiny"})
    await session.close()
    assert not asyncio.all_tasks() - {asyncio.current_task()}
