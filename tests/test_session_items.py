"""Turn session, conversation items, on the scripted engine: create, delete, retrieve,
truncate, and the cap on the speech a conversation keeps."""

from __future__ import annotations

import pytest

from tests.scripted_engine import pcm16_b64, turn_session
from vllm_omni.session.base import SessionOptions


def text_item(text: str, role: str = "user", **fields) -> dict:
    return {"type": "conversation.item.create", **fields,
            "item": {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}}


def audio_item(seconds: float, **part) -> dict:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": pcm16_b64(seconds, 0.1), **part}]}}


async def test_text_and_audio_items_enter_the_history_in_order() -> None:
    session, engine, events = turn_session()
    await session.handle(text_item("Hello."))
    await session.handle(text_item("Be terse.", role="system"))
    await session.handle(audio_item(0.5, transcript="spoken"))
    assert events.kinds() == ["conversation.item.added", "conversation.item.created", "conversation.item.done"] * 2 \
        + ["conversation.item.added", "conversation.item.created", "input_audio_buffer.committed",
           "conversation.item.done"]
    audio = events.last("conversation.item.done")["item"]
    assert audio["content"] == [{"type": "input_audio", "transcript": "spoken"}]
    await session.handle({"type": "response.create", "response": {"output_modalities": ["text"]}})
    await events.wait("response.done")
    messages = engine.requests[0].messages
    assert [(m.role, m.text) for m in messages] == [("user", "Hello."), ("system", "Be terse."), ("user", None)]
    assert messages[2].audio_stream.num_samples == 8000


async def test_an_answer_goes_back_to_the_engine_with_the_ids_it_was_generated_as() -> None:
    session, engine, events = turn_session()
    for turn in range(2):
        await session.handle(text_item(f"Question {turn}."))
        await session.handle({"type": "response.create", "response": {"output_modalities": ["text"]}})
        await events.wait("response.done", count=turn + 1)
    answer = engine.requests[1].messages[1]
    assert answer.role == "assistant" and answer.text and answer.token_ids == (1, 2)  # the script's two text steps
    # both turns ask for the replicas of the session (whose prefix caches hold its conversation)
    assert [r.affinity_key for r in engine.requests] == [session.config.id] * 2


async def test_previous_item_id_places_the_item() -> None:
    session, _, events = turn_session()
    for text in ("a", "b"):
        await session.handle(text_item(text))
    first, second = (e["item"]["id"] for e in events.of("conversation.item.done"))
    await session.handle(text_item("root", previous_item_id="root"))
    await session.handle(text_item("middle", previous_item_id=first))
    assert [i.text for i in session.items.conversation.items] == ["root", "a", "middle", "b"]
    assert events.last("conversation.item.added")["previous_item_id"] == first
    await session.handle(text_item("lost", previous_item_id="item_nope"))
    assert events.last("error")["error"]["param"] == "previous_item_id"
    assert second in {i.id for i in session.items.conversation.items}


@pytest.mark.parametrize(("item", "code", "param"), [
    (None, "missing_required_parameter", "item"),
    ({"type": "function_call_output", "call_id": "c", "output": "{}"}, "invalid_function_call_output", "item.call_id"),
    ({"type": "function_call"}, "missing_required_parameter", "item.call_id"),
    ({"type": "function_call", "call_id": "c"}, "missing_required_parameter", "item.name"),
    ({"content": [{"type": "input_image", "image_url": "data:"}]}, "invalid_image", "item.content.0.image_url"),
    ({"role": "assistant", "content": [{"type": "input_audio", "audio": pcm16_b64(0.2)}]}, "bad_event",
     "item.content.0"),
    ({"content": [{"type": "input_audio", "audio": pcm16_b64(0.05)}]}, "bad_audio", "item.content"),
    ({"content": [{"type": "input_audio", "audio": ""}]}, "bad_audio", "item.content.0.audio"),
    ({"content": [{"type": "input_audio", "audio": "***"}]}, "bad_audio", "item.content.0.audio"),
    ({"content": [{"type": "input_audio", "audio": pcm16_b64(0.2), "sample_rate_hz": 1}]}, "bad_event",
     "item.content.0.sample_rate_hz"),
])
async def test_bad_items_are_refused_and_change_nothing(item: dict | None, code: str, param: str) -> None:
    session, _, events = turn_session()
    await session.handle({"type": "conversation.item.create", "event_id": "e", "item": item})
    error = events.last("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == (code, param, "e")
    assert not session.items.conversation.items and not session.responses.unanswered


async def test_duplicate_item_ids_are_refused() -> None:
    session, _, events = turn_session()
    await session.handle(text_item("a") | {"item": {"id": "item_1", "content": []}})
    await session.handle(text_item("b") | {"item": {"id": "item_1", "content": []}})
    assert events.errors() == ["bad_event"] and len(session.items.conversation.items) == 1


async def test_delete_and_retrieve() -> None:
    session, _, events = turn_session()
    await session.handle(text_item("keep me"))
    item_id = events.last("conversation.item.done")["item"]["id"]
    await session.handle({"type": "conversation.item.retrieve", "item_id": item_id})
    assert events.last("conversation.item.retrieved")["item"]["content"][0]["text"] == "keep me"
    await session.handle({"type": "conversation.item.delete", "item_id": item_id})
    deleted = events.last("conversation.item.deleted")
    assert deleted["item_id"] == item_id and deleted["event"]["deleted"] is True
    await session.handle({"type": "conversation.item.retrieve", "item_id": item_id})
    await session.handle({"type": "conversation.item.delete"})
    assert events.errors() == ["item_retrieve_invalid_item_id", "missing_required_parameter"]
    await session.handle({"type": "conversation.item.delete", "item_id": item_id})
    assert events.last("error")["error"]["code"] == "item_delete_invalid_item_id"


async def test_truncate_cuts_the_spoken_text_and_acknowledges() -> None:
    session, _, events = turn_session()
    await session.handle(text_item("Hi."))
    await session.handle({"type": "response.create"})
    done = (await events.wait("response.done"))["response"]
    item = done["output"][0]
    assert item["content"][0]["audio_duration_ms"] == 200
    user_id = events.of("conversation.item.done")[0]["item"]["id"]
    refused = [({"item_id": user_id, "audio_end_ms": 10}, "invalid_value", "item_id"),
               ({"item_id": "item_nope", "audio_end_ms": 10}, "item_truncate_invalid_item_id", "item_id"),
               ({"item_id": item["id"], "content_index": 1, "audio_end_ms": 10}, "invalid_value", "content_index"),
               ({"item_id": item["id"]}, "missing_required_parameter", "audio_end_ms"),
               ({"item_id": item["id"], "audio_end_ms": 999}, "invalid_value", "audio_end_ms")]
    for fields, code, param in refused:
        await session.handle({"type": "conversation.item.truncate", **fields})
        error = events.last("error")["error"]
        assert (error["code"], error["param"]) == (code, param), fields
    await session.handle({"type": "conversation.item.truncate", "item_id": item["id"], "audio_end_ms": 100})
    assert events.kinds()[-2:] == ["conversation.item.truncated", "playback.acknowledged"]
    ack = events.last("playback.acknowledged")["event"]
    assert (ack["played_ms"], ack["committed_ms"], ack["truncate"]) == (100, 100, True)
    assert ack["playback"]["committed_ms"] == 100
    kept = session.items.get(item["id"]).kept_text
    assert kept == "Hello there."[:6]  # half the audio: half the text


async def test_stored_speech_is_capped_oldest_first() -> None:
    session, _, _ = turn_session(options=SessionOptions(served_models=["tiny"], max_history_audio_s=0.5))
    for _ in range(3):
        await session.handle(audio_item(0.3))
    assert [i.held_audio_ms for i in session.items.conversation.items] == [0, 0, 300]
