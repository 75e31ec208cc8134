"""GA-lane sessions against a real server: server VAD turns, barge-in, cancel, errors, the SDK."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from tests.realtime_helpers import MODEL_NAME, Client, append_events, connect, fixture_pcm, running_server

SERVER_VAD_UPDATE = {"type": "session.update", "session": {
    "model": MODEL_NAME, "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                             "turn_detection": {"type": "server_vad"}}}}}
S2_ORDER = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed", "response.created", "response.output_audio.delta",
            "response.output_audio.done", "response.done"]


@pytest.fixture(scope="module")
def server(tiny_loaded):
    overrides = {"stages.1.default_sampling_params.max_tokens": 64,
                 "stages.1.default_sampling_params.min_tokens": 40}
    with running_server(tiny_loaded, overrides) as (url, engine, _):
        yield url, engine


async def opened(url: str, update: dict | None = None) -> Client:
    client = await connect(url)
    assert (await client.next())["type"] == "session.created"
    if update is not None:
        await client.send(update)
        assert (await client.next())["type"] == "session.updated"
    return client


def check_s2_turn(events: list[dict]) -> tuple[str, str]:
    kinds = [e["type"] for e in events]
    assert "error" not in kinds
    firsts = [kinds.index(k) for k in S2_ORDER]
    assert firsts == sorted(firsts)
    for kind in S2_ORDER:
        if kind != "response.output_audio.delta":
            assert kinds.count(kind) == 1, kind
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert deltas and any(base64.b64decode(e["delta"]) for e in deltas)
    started, stopped, committed = (next(e for e in events if e["type"] == k) for k in S2_ORDER[:3])
    item_id = started["item_id"]
    assert stopped["item_id"] == committed["item_id"] == item_id
    user_item_events = [e for e in events if e["type"] in ("conversation.item.added", "conversation.item.done")
                        and e["item"]["id"] == item_id]
    assert [e["type"] for e in user_item_events] == ["conversation.item.added", "conversation.item.done"]
    assert all(e["item"]["role"] == "user" for e in user_item_events)
    created = next(e for e in events if e["type"] == "response.created")
    done = events[-1]
    assert created["response"]["id"] == done["response"]["id"] and done["response"]["status"] == "completed"
    assert all(e["vllm_omni"]["sample_rate_hz"] == 24000 for e in deltas)
    assert deltas[-1]["vllm_omni"]["audio_duration_ms"] > 0
    assert done["vllm_omni"]["stage_metrics"]["0"]["num_tokens_out"] > 0
    return item_id, created["response"]["id"]


def test_server_vad_two_turns(server) -> None:
    url, engine = server

    async def scenario():
        client = await connect(url)
        assert (await client.next())["type"] == "session.created"
        await client.send(SERVER_VAD_UPDATE)
        updated = await client.next()
        td = updated["session"]["audio"]["input"]["turn_detection"]
        assert td["type"] == "server_vad" and td["silence_duration_ms"] == 500
        assert td["create_response"] is True and td["interrupt_response"] is False
        ids = []
        for fixture in ("speech_en_single.wav", "speech_with_pause.wav"):
            await client.send_all(append_events(fixture_pcm(fixture, trailing_silence_s=1.5)))
            turn = await client.until("response.done")
            ids.append(check_s2_turn([e for e in turn if e["type"] != "rate_limits.updated"]))
        (item1, resp1), (item2, resp2) = ids
        assert item1 != item2 and resp1 != resp2
        await client.close()

    asyncio.run(scenario())


def test_barge_in_cancels_the_response_and_starts_the_next_turn(server) -> None:
    url, _ = server
    update = json.loads(json.dumps(SERVER_VAD_UPDATE))
    update["session"]["audio"]["input"]["turn_detection"]["interrupt_response"] = True

    async def scenario():
        client = await opened(url, update)
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=1.0)))
        first = await client.until("response.created")
        first_id = first[-1]["response"]["id"]
        await client.send_all(append_events(fixture_pcm("speech_with_pause.wav", trailing_silence_s=1.0)))
        interrupted = await client.until("response.done")
        assert interrupted[-1]["response"]["id"] == first_id
        assert interrupted[-1]["response"]["status"] == "cancelled"
        assert interrupted[-1]["response"]["status_details"]["reason"] == "turn_detected"
        kinds = [e["type"] for e in interrupted]
        assert kinds.index("input_audio_buffer.speech_started") < kinds.index("response.done")
        nxt = await client.until("response.done")
        assert nxt[-1]["response"]["status"] == "completed" and nxt[-1]["response"]["id"] != first_id
        assert not any(e.get("response_id") == first_id for e in nxt)  # nothing more of the cancelled one
        await client.close()

    asyncio.run(scenario())


async def start_manual_turn(client: Client, modalities: list[str] | None = None) -> None:
    """Append a spoken question, commit it, ask for a response."""
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit"})
    response = {"output_modalities": modalities} if modalities else {}
    await client.send({"type": "response.create", "response": response})


async def send_text_item(client: Client, text: str) -> None:
    await client.send({"type": "conversation.item.create",
                       "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})


async def manual_turn(client: Client, modalities: list[str] | None = None) -> list[dict]:
    await start_manual_turn(client, modalities)
    return await client.until("response.done")


def test_response_cancel_mid_stream(server) -> None:
    url, _ = server

    async def scenario():
        client = await opened(url)
        await start_manual_turn(client)
        await client.until("response.output_audio.delta")
        await client.send({"type": "response.cancel"})
        after = await client.until("response.done")
        assert sum(e["type"] == "response.output_audio.delta" for e in after) <= 1
        assert after[-1]["response"]["status"] == "cancelled"
        assert after[-1]["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        assert after[-1]["response"]["output"][0]["status"] == "incomplete"
        await client.send({"type": "response.cancel"})
        tail = await client.until("error")
        assert tail[-1]["error"]["code"] == "response_cancel_not_active"
        assert not any(e["type"] == "response.output_audio.delta" for e in tail)
        done = await manual_turn(client)
        assert done[-1]["response"]["status"] == "completed"
        await client.close()

    asyncio.run(scenario())


def append_with(**fields) -> dict:
    return {"type": "input_audio_buffer.append", **fields}


ERROR_CASES = [
    ("invalid JSON", "{not json", "invalid_json"),
    ("unknown event type", {"type": "input_audio_buffer.frobnicate", "event_id": "e1"}, "unknown_event"),
    ("bad base64", append_with(audio="***", event_id="e2"), "bad_audio"),
    ("odd-length PCM", append_with(audio=base64.b64encode(b"\x01\x02\x03").decode(), event_id="e3"), "bad_audio"),
    ("unsupported format", {"type": "session.update", "event_id": "e4",
                            "session": {"input_audio_format": "mp3"}}, "unsupported_audio_format"),
    ("rate out of range", append_with(audio=base64.b64encode(b"\0\0").decode(), sample_rate_hz=4000,
                                      event_id="e5"), "bad_event"),
    ("unsupported turn detection", {"type": "session.update", "event_id": "e6",
                                    "session": {"turn_detection": {"type": "push_to_talk"}}},
     "unsupported_turn_detection"),
    ("unknown model", {"type": "session.update", "event_id": "e7", "session": {"model": "gpt-9"}},
     "model_not_found"),
    ("commit on empty buffer", {"type": "input_audio_buffer.commit", "event_id": "e8"},
     "input_audio_buffer_commit_empty"),
    ("response.cancel without a response", {"type": "response.cancel", "event_id": "e9"},
     "response_cancel_not_active"),
    ("binary frame", b"\x00\x01", "bad_event"),
    ("not an object", "[1, 2]", "bad_event"),
    ("oversized message", json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (15 * 1024 * 1024 + 8)}),
     "event_too_large"),
    ("unknown item", {"type": "conversation.item.delete", "item_id": "item_nope", "event_id": "e10"},
     "item_delete_invalid_item_id"),
]


def test_every_error_case_then_a_successful_turn(server) -> None:
    url, _ = server

    async def scenario():
        client = await opened(url)
        for name, payload, code in ERROR_CASES:
            await client.send(payload)
            error = (await client.until("error"))[-1]["error"]
            assert error["code"] == code, name
            assert error["message"]
            if isinstance(payload, dict) and "event_id" in payload:
                assert error["event_id"] == payload["event_id"], name
            done = await manual_turn(client, modalities=["text"] if code != "bad_audio" else None)
            assert done[-1]["response"]["status"] in ("completed", "incomplete"), name
        await client.close()

    asyncio.run(scenario())


def test_response_create_while_active(server) -> None:
    url, _ = server

    async def scenario():
        client = await opened(url)
        await start_manual_turn(client)
        await client.until("response.created")
        await client.send({"type": "response.create", "event_id": "again"})
        events = await client.until("response.done")
        errors = [e for e in events if e["type"] == "error"]
        assert [e["error"]["code"] for e in errors] == ["conversation_already_has_active_response"]
        assert errors[0]["error"]["event_id"] == "again"
        assert events[-1]["response"]["status"] == "completed"
        await client.close()

    asyncio.run(scenario())


def test_text_item_history_and_session_close(server) -> None:
    url, engine = server

    async def scenario():
        client = await opened(url)
        await send_text_item(client, "Hello there.")
        added = await client.until("conversation.item.done")
        assert added[0]["type"] == "conversation.item.added"
        await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        events = await client.until("response.done")
        kinds = [e["type"] for e in events]
        assert "response.output_text.delta" in kinds and "response.output_audio.delta" not in kinds
        text = next(e for e in events if e["type"] == "response.output_text.done")["text"]
        assert text
        await client.send({"type": "session.close"})
        closed = await client.until("session.closed")
        assert closed[-1]["reason"] == "client_close"
        await asyncio.sleep(0.2)
        assert client.ws.close_code == 1000

    asyncio.run(scenario())
    assert engine.num_active_requests() == 0


def test_openai_sdk_completes_a_turn(server) -> None:
    from openai import AsyncOpenAI

    url, _ = server
    http_url = url.replace("ws://", "http://") + "/v1"

    async def scenario():
        client = AsyncOpenAI(base_url=http_url, api_key="unused")
        async with client.realtime.connect(model=MODEL_NAME) as connection:
            created = await connection.recv()
            await connection.session.update(session={
                "type": "realtime", "output_modalities": ["audio"],
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}})
            updated = await connection.recv()
            # what OpenAI's server sends beyond the SDK's session model, and clients key on (§2.6)
            assert (created.type, updated.type) == ("session.created", "session.updated")
            extras = [(event.session.model_extra["object"], event.session.model_extra["id"])
                      for event in (created, updated)]
            assert extras[0] == extras[1] and extras[0][0] == "realtime.session" and extras[0][1].startswith("sess_")
            pcm = fixture_pcm("speech_en_single.wav")
            for i in range(0, len(pcm), 6400):
                await connection.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + 6400]).decode())
            await connection.input_audio_buffer.commit()
            await connection.response.create()
            audio, transcript = b"", ""
            async for server_event in connection:
                if server_event.type == "response.output_audio.delta":
                    audio += base64.b64decode(server_event.delta)
                elif server_event.type == "response.output_audio_transcript.delta":
                    transcript += server_event.delta
                elif server_event.type == "error":
                    raise AssertionError(server_event.error)
                elif server_event.type == "response.done":
                    assert server_event.response.status == "completed"
                    break
        assert len(audio) > 4096 and transcript

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_idle_timeout_commits_an_empty_turn_and_answers(server) -> None:
    url, _ = server
    update = json.loads(json.dumps(SERVER_VAD_UPDATE))
    update["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] = 200

    async def scenario():
        client = await opened(url, update)
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=1.5)))
        first = await client.until("response.done")
        played_s = first[-1]["response"]["output"][0]["content"][0]["audio_duration_ms"] / 1000
        idle = await client.until("response.done", timeout=played_s + 60)
        kinds = [e["type"] for e in idle]
        assert kinds.index("input_audio_buffer.timeout_triggered") < kinds.index("input_audio_buffer.committed") \
            < kinds.index("response.created")
        assert "input_audio_buffer.speech_started" not in kinds
        timeout = next(e for e in idle if e["type"] == "input_audio_buffer.timeout_triggered")
        committed = next(e for e in idle if e["type"] == "input_audio_buffer.committed")
        assert committed["item_id"] == timeout["item_id"]
        assert timeout["_t"] - first[-1]["_t"] >= played_s  # not before the answer finished playing
        assert idle[-1]["response"]["status"] == "completed"
        await client.close()

    asyncio.run(scenario())


def test_out_of_band_response_stays_out_of_the_history(server) -> None:
    url, _ = server

    async def scenario():
        client = await opened(url)
        await send_text_item(client, "Summarise our talk.")
        await client.until("conversation.item.done")
        await client.send({"type": "response.create",
                           "response": {"conversation": "none", "output_modalities": ["text"],
                                        "metadata": {"purpose": "summary"}}})
        done = (await client.until("response.done"))[-1]["response"]
        assert done["conversation_id"] is None and done["metadata"]["purpose"] == "summary"
        await client.send({"type": "conversation.item.retrieve", "item_id": done["output"][0]["id"]})
        assert (await client.until("error"))[-1]["error"]["code"] == "item_retrieve_invalid_item_id"
        await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        regular = (await client.until("response.done"))[-1]["response"]
        assert regular["conversation_id"].startswith("conv_") and regular["status"] == "completed"
        await client.close()

    asyncio.run(scenario())
