"""The duplex lane against a real server on the tiny duplex deploy (docs/realtime-api.md §13):
autostart, a manual-commit turn answered with speech, playback acks, close; and a handshake
that fails."""

from __future__ import annotations

import asyncio

import pytest
import websockets

from tests.realtime_helpers import MODEL_NAME, Client, append_events, fixture_pcm, running_server


@pytest.fixture(scope="module")
def server(tiny_loaded):
    overrides = {"stages.1.default_sampling_params.max_tokens": 48}
    with running_server(tiny_loaded, overrides, session_mode="duplex") as (url, engine, _):
        yield url, engine


async def until(client: Client, kind: str) -> list[dict]:
    return await client.until(kind, timeout=120)


async def test_a_duplex_session_opens_by_autostart_answers_a_turn_and_closes(server) -> None:
    url, engine = server
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
    created, updated = await client.next(), await client.next()
    assert (created["type"], updated["type"]) == ("session.created", "session.updated")
    assert created["session"]["id"].startswith("duplex-")
    assert created["session"]["capabilities"]["chunk_period_ms"] == 1000
    await client.send({"type": "session.update", "session": {
        "modalities": ["audio", "text"], "input_audio_format": "pcm16", "turn_detection": None,
        "overlap_policy": "listen_only", "playback_commit_policy": "ack_only", "extra_body": {}}})
    assert (await client.next())["type"] == "session.updated"
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    turn = await until(client, "response.done")
    done = turn[-1]["response"]
    assert done["status"] == "completed" and "error" not in [e["type"] for e in turn]
    audio_ms = max(e["vllm_omni"]["audio_duration_ms"] for e in turn if e["type"] == "response.output_audio.delta")
    await client.send({"type": "playback.ack", "response_id": done["id"], "item_id": f"item_{done['id']}",
                       "played_ms": audio_ms})
    acked = (await until(client, "playback.acknowledged"))[-1]["event"]
    assert (acked["item_id"], acked["played_ms"]) == (f"item_{done['id']}", audio_ms)
    await client.send({"type": "conversation.item.retrieve", "item_id": f"item_{done['id']}"})
    retrieved = (await until(client, "conversation.item.retrieved"))[-1]["item"]
    assert retrieved["role"] == "assistant" and retrieved["status"] == "completed"
    await client.send({"type": "session.close"})
    closed = (await until(client, "session.closed"))[-1]
    assert closed["session_id"] == created["session"]["id"]
    await asyncio.wait_for(client.ws.wait_closed(), 10)
    assert client.ws.close_code == 1000
    await client.close()


async def test_a_failed_handshake_is_one_error_then_close_1008(server) -> None:
    url, _ = server
    client = await Client.open(f"{url}/v1/duplex?autostart=0", extensions=False)
    await client.send("{not json")
    error = await client.next()
    assert error["type"] == "error" and error["error"]["code"] == "invalid_json"
    with pytest.raises(websockets.exceptions.ConnectionClosed):
        await client.next(timeout=10)
    assert client.ws.close_code == 1008 and client.ws.close_reason == "invalid_json"
    await client.close()
