"""Turn session, responses, on the scripted engine: response.create and what it asks the
engine for, cancel, output_audio_buffer.clear, playback acks, engine failures and stalls,
and closing a session mid-answer."""

from __future__ import annotations

import asyncio

import pytest

from tests.scripted_engine import Audio, Finish, Raise, Stall, Text, Wait, turn_session
from vllm_omni.engine.request import FinishReason, RequestError, StageUnavailableError
from vllm_omni.session.base import SessionOptions


async def with_question(options: SessionOptions | None = None, **config):
    session, engine, events = turn_session(options=options, **config)
    await session.handle({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi?"}]}})
    return session, engine, events


async def test_a_response_streams_its_audio_and_reports_usage() -> None:
    session, engine, events = await with_question(instructions="Be kind.")
    await session.handle({"type": "response.create"})
    assert session.session_object()["turn_state"] == "assistant_generating"
    done = (await events.wait("response.done"))["response"]
    kinds = events.kinds(events.index(events.last("response.created")))
    assert kinds == ["response.created", "conversation.item.added", "conversation.item.created",
                     "response.output_item.added", "response.content_part.added",
                     "response.output_audio_transcript.delta", "response.output_audio.delta",
                     "response.output_audio_transcript.delta", "response.output_audio.delta",
                     "response.output_audio.done", "response.output_audio_transcript.done",
                     "response.content_part.done", "response.output_item.done", "conversation.item.done",
                     "response.done", "rate_limits.updated"]
    deltas = events.of("response.output_audio.delta")
    assert [d["vllm_omni"]["audio_duration_ms"] for d in deltas] == [100, 200]
    assert all(d["vllm_omni"]["sample_rate_hz"] == 24000 for d in deltas)
    assert done["status"] == "completed" and done["output"][0]["content"][0]["transcript"] == "Hello there."
    assert done["usage"]["input_tokens"] == 7 and done["usage"]["output_token_details"]["text_tokens"] == 2
    report = events.last("response.done")["vllm_omni"]
    assert done["metadata"] is None and report["committed"] is True  # metadata: the client's only
    stages = report["stage_metrics"]
    assert (stages["0"]["role"], stages["0"]["finish_reason"], stages["1"]["finish_reason"]) == ("llm", "stop", None)
    request = engine.requests[0]
    assert [(m.role, m.text) for m in request.messages] == [("system", "Be kind."), ("user", "Hi?")]
    assert (request.speaker, request.max_output_tokens, request.temperature, request.sampling) == \
        (None, None, None, {})  # None: the engine's default voice
    assert request.request_id == f"sess_test-{done['id']}" and session.session_object()["turn_state"] == "idle"


async def test_response_overrides_reach_the_engine_request() -> None:
    session, engine, events = await with_question()
    await session.handle({"type": "response.create", "response": {
        "output_modalities": ["text"], "voice": "Bruno", "max_output_tokens": 5, "temperature": 0.3,
        "instructions": "Short.", "metadata": {"k": "v"}}})
    done = (await events.wait("response.done"))["response"]
    request = engine.requests[0]
    assert (request.modalities, request.speaker, request.max_output_tokens, request.temperature) == \
        (("text",), "bruno", 5, 0.3)
    assert request.messages[0].text == "Short." and done["metadata"]["k"] == "v"
    assert events.last("response.output_text.done")["text"] == "Hello there."
    assert not events.of("response.output_audio.delta")


@pytest.mark.parametrize(("voice", "default", "speaker"), [
    ("nobody", None, None),  # an unknown voice: the engine's default
    (None, "bruno", "bruno"),  # the deploy's default voice
    ("ARIA", "bruno", "aria"),
])
async def test_the_speaker_follows_the_voice_then_the_deploy_default(voice, default, speaker) -> None:
    session, engine, events = await with_question(
        options=SessionOptions(served_models=["tiny"], default_speaker=default), voice=voice)
    await session.handle({"type": "response.create"})
    await events.wait("response.done")
    assert engine.requests[0].speaker == speaker


@pytest.mark.parametrize(("response", "code"), [
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "nope"}}]}, "invalid_value"),
    ({"tools": [{"type": "web_search"}]}, "invalid_value"),
    ({"tool_choice": {"type": "function"}}, "invalid_value"),
    ({"output_modalities": ["video"]}, "bad_event"),
    ({"audio": {"output": {"voice": {"id": "v"}}}}, "bad_event"),
    ({"output_audio_format": "mp3"}, "unsupported_audio_format"),
])
async def test_bad_response_options_are_refused(response: dict, code: str) -> None:
    session, engine, events = await with_question()
    await session.handle({"type": "response.create", "response": response})
    assert events.errors() == [code] and not events.of("response.created") and session.responses.unanswered


async def test_response_create_answers_whatever_the_conversation_holds() -> None:
    session, engine, events = turn_session(instructions="Greet the caller.")
    await session.handle({"type": "response.create"})  # greet-first: nothing to answer but instructions
    assert (await events.wait("response.done"))["response"]["status"] == "completed"
    assert [(m.role, m.text) for m in engine.requests[0].messages] == [("system", "Greet the caller."),
                                                                       ("user", " ")]
    await session.handle({"type": "response.create"})  # another reply to the conversation so far
    await events.wait("response.done", count=2)
    assert [m.role for m in engine.requests[1].messages] == ["system", "assistant", "user"]
    assert not events.errors()


async def test_response_create_while_one_is_active_is_refused() -> None:
    session, engine, events = await with_question()
    engine.script(Text("a"), Wait(0.05))
    await session.handle({"type": "response.create"})
    active = events.last("response.created")["response"]["id"]
    await session.handle({"type": "response.create", "event_id": "again"})
    error = events.last("error")["error"]
    assert (error["code"], error["event_id"]) == ("conversation_already_has_active_response", "again")
    assert active in error["message"]
    assert (await events.wait("response.done"))["response"]["status"] == "completed"
    assert len(engine.requests) == 1


async def test_an_out_of_band_response_stays_out_of_the_history() -> None:
    session, engine, events = await with_question()
    await session.handle({"type": "response.create", "response": {"conversation": "none"}})
    done = (await events.wait("response.done"))["response"]
    assert done["conversation_id"] is None
    assert [i.role for i in session.items.conversation.items] == ["user"] and session.responses.unanswered
    await session.handle({"type": "response.create"})
    assert (await events.wait("response.done", count=2))["response"]["conversation_id"] == "conv_sess_test"
    assert [i.role for i in session.items.conversation.items] == ["user", "assistant"]


# Cancel and clear ----------------------------------------------------------------------------------

async def test_cancel_a_stalled_response() -> None:
    session, engine, events = await with_question()
    engine.script(Text("thinking"), Audio(100), Stall())
    await session.handle({"type": "response.create"})
    response_id = (await events.wait("response.output_audio.delta"))["response_id"]
    await session.handle({"type": "response.cancel", "response_id": response_id})
    done = events.last("response.done")["response"]
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert done["output"][0]["status"] == "incomplete"
    emitted = len(events)
    await asyncio.sleep(0.01)
    assert engine.aborted == [engine.requests[0].request_id] and len(events) == emitted  # nothing after done
    await session.handle({"type": "response.cancel"})
    await session.handle({"type": "response.cancel", "response_id": response_id})
    await session.handle({"type": "response.cancel", "response_id": "resp_other"})
    assert events.errors() == ["response_cancel_not_active"] * 3


async def test_cancel_names_only_the_active_response() -> None:
    session, engine, events = await with_question()
    await session.handle({"type": "response.create"})
    first = (await events.wait("response.done"))["response"]["id"]
    await session.handle({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "More?"}]}})
    engine.script(Stall())
    await session.handle({"type": "response.create"})
    await session.handle({"type": "response.cancel", "response_id": first})
    assert "already complete" in events.last("error")["error"]["message"]
    await session.handle({"type": "response.cancel"})
    assert events.last("response.done")["response"]["status"] == "cancelled"


async def test_output_audio_buffer_clear_stops_the_active_response() -> None:
    session, engine, events = turn_session()
    await session.handle({"type": "output_audio_buffer.clear"})
    assert events.last("output_audio_buffer.cleared")["response_id"] is None
    session, engine, events = await with_question()
    engine.script(Text("a"), Stall())
    await session.handle({"type": "response.create"})
    await session.handle({"type": "output_audio_buffer.clear"})
    response_id = events.last("response.created")["response"]["id"]
    assert events.last("output_audio_buffer.cleared")["response_id"] == response_id
    done = events.last("response.done")["response"]
    assert done["status_details"]["reason"] == "output_audio_buffer_clear"
    await session.handle({"type": "output_audio_buffer.clear", "response_id": response_id})  # done: no cancel
    assert len(events.of("response.done")) == 1 and len(events.of("output_audio_buffer.cleared")) == 2


# Playback acks ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["playback.ack", "audio.playback_ack"])
async def test_playback_acks_move_the_ledger(kind: str) -> None:
    session, engine, events = turn_session()
    await session.handle({"type": kind, "played_ms": 10})
    assert events.errors() == ["playback_item_not_found"]
    session, engine, events = await with_question()
    await session.handle({"type": "response.create"})
    response_id = (await events.wait("response.done"))["response"]["id"]
    await session.handle({"type": kind, "played_ms": 150})
    ack = events.last("playback.acknowledged")["event"]
    assert (ack["item_id"], ack["played_ms"], ack["committed_ms"], ack["truncate"]) == \
        (f"item_{response_id}", 150, 150, False)
    await session.handle({"type": kind, "item_id": f"item_{response_id}", "played_ms": 50, "committed_ms": 100,
                          "truncate": True})
    ack = events.last("playback.acknowledged")["event"]
    assert ack["playback"]["played_ms"] == 150 and ack["history_committed"] is True  # never moves back
    assert session.items.get(f"item_{response_id}").kept_text == "Hello "
    await session.handle({"type": kind, "item_id": "item_x", "response_id": response_id, "played_ms": 1})
    await session.handle({"type": kind, "response_id": response_id})
    assert events.errors()[-2:] == ["playback_item_mismatch", "missing_required_parameter"]


# Engine failures ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("steps", "code"), [
    ((Raise(RequestError("speaker: unknown")),), "invalid_request_error"),
    ((Raise(StageUnavailableError("stage 1 is unavailable")),), "stage_unavailable"),
    ((Text("a"), Raise(RuntimeError("boom"))), "engine_error"),
    ((Text("a"), Finish(FinishReason.ERROR, error="died", error_code="stage_unavailable")), "stage_unavailable"),
    ((Finish(FinishReason.ERROR),), "engine_error"),
])
async def test_engine_failures_fail_the_response_only(steps: tuple, code: str) -> None:
    session, engine, events = await with_question()
    engine.script(*steps)
    await session.handle({"type": "response.create"})
    done = (await events.wait("response.done"))["response"]
    assert events.errors() == [code]
    assert (done["status"], done["status_details"]["reason"]) == ("failed", code)
    assert done["status_details"]["error"]["type"] == "server_error"
    await session.handle({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Again?"}]}})
    await session.handle({"type": "response.create"})
    assert (await events.wait("response.done", count=2))["response"]["status"] == "completed"


@pytest.mark.parametrize(("limit", "status"), [(3, "incomplete"), (None, "completed")])
async def test_a_length_finish_is_incomplete_only_under_a_client_limit(limit, status) -> None:
    session, engine, events = await with_question()
    engine.script(Text("a b c"), Finish(FinishReason.LENGTH))
    await session.handle({"type": "response.create", "response": {} if limit is None else {"max_tokens": limit}})
    done = (await events.wait("response.done"))["response"]
    assert done["status"] == status and done["max_output_tokens"] == (limit or "inf")


async def test_close_mid_answer_aborts_and_emits_nothing_more() -> None:
    session, engine, events = await with_question()
    engine.script(Text("a"), Stall())
    await session.handle({"type": "input_audio_buffer.append", "audio": "AAAA"})
    await session.handle({"type": "response.create"})
    await events.wait("response.output_audio_transcript.delta")
    task = session.responses.active.task
    await session.close()
    assert engine.aborted == [engine.requests[0].request_id] and task.done()
    assert not events.of("response.done") and session.responses.active is None
    assert not session.items.conversation.items and session.input.pending.size == 0
