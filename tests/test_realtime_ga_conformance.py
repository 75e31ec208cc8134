"""A third-party GA client against a real server: it never asks for extensions, so every event
it receives must be a GA server event as OpenAI's server sends it: the `openai` SDK's GA models
as a floor, plus only the fields OpenAI adds (tests/ga_conformance.py), across a session with
greet-first, manual, text-only and server-VAD turns, barge-in, cancel, item operations and
errors (docs/realtime-api.md §1.3)."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import websockets

from tests.conftest import read_fixture_pcm
from tests.ga_conformance import ga_problems
from tests.realtime_helpers import MODEL_NAME, Client, connect, running_server
from vllm_omni.audio.pcm import resample

GA_RATE = 24000  # GA's audio/pcm: the client says no rate, the server assumes this one


@pytest.fixture(scope="module")
def server(turn_model):
    overrides = {"stages.1.default_sampling_params.max_tokens": 64,
                 "stages.1.default_sampling_params.min_tokens": 40}
    with running_server(turn_model, overrides) as (url, _, _):
        yield url


def speech(name: str, trailing_silence_s: float = 0.0) -> list[dict]:
    """A 16 kHz test recording as GA appends: 24 kHz PCM16 in 100 ms chunks, no rate given."""
    samples = resample(read_fixture_pcm(name), 16000, GA_RATE)
    samples = np.concatenate([samples, np.zeros(int(GA_RATE * trailing_silence_s), np.float32)])
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    step = GA_RATE * 2 // 10
    return [{"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i:i + step]).decode()}
            for i in range(0, len(pcm), step)]


def text_item(text: str) -> dict:
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


async def done(client: Client) -> dict:
    return (await client.until("response.done"))[-1]["response"]


async def error_code(client: Client, event: dict) -> str:
    await client.send(event)
    return (await client.until("error"))[-1]["error"]["code"]


async def conversation_turns(client: Client) -> None:
    """Greet-first, a spoken turn, a text turn, item operations, errors and a cancel."""
    await client.send({"type": "session.update", "session": {
        "type": "realtime", "model": MODEL_NAME, "instructions": "You are a helpful assistant.",
        "output_modalities": ["audio"], "audio": {"input": {"format": {"type": "audio/pcm", "rate": GA_RATE},
                                                            "turn_detection": None}}}})
    await client.until("session.updated")
    await client.send({"type": "response.create", "response": {"instructions": "Greet the user.",
                                                               "metadata": {"step": "greet"}}})
    greeting = await done(client)
    assert (greeting["status"], greeting["metadata"]) == ("completed", {"step": "greet"})

    await client.send_all(speech("speech_en_single.wav"))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    spoken = await done(client)
    assert spoken["status"] == "completed" and spoken["output"][0]["content"][0]["transcript"]
    answer = spoken["output"][0]["id"]

    await client.send({"type": "session.heartbeat"})  # extension client events: applied, never answered
    await client.send({"type": "playback.ack", "response_id": spoken["id"], "played_ms": 100})
    await client.send(text_item("Hello there."))
    question = (await client.until("conversation.item.done"))[-1]["item"]["id"]
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    written = await client.until("response.done")
    assert "response.output_text.delta" in [e["type"] for e in written]

    await client.send({"type": "conversation.item.retrieve", "item_id": answer})
    assert (await client.until("conversation.item.retrieved"))[-1]["item"]["id"] == answer
    await client.send({"type": "conversation.item.truncate", "item_id": answer, "content_index": 0,
                       "audio_end_ms": 100})
    assert (await client.until("conversation.item.truncated"))[-1]["audio_end_ms"] == 100
    await client.send({"type": "conversation.item.delete", "item_id": question})
    await client.until("conversation.item.deleted")

    assert await error_code(client, {"type": "input_audio_buffer.commit"}) == "input_audio_buffer_commit_empty"
    assert await error_code(client, {"type": "response.cancel"}) == "response_cancel_not_active"
    assert await error_code(client, {"type": "conversation.item.delete", "item_id": "item_nope"}) == \
        "item_delete_invalid_item_id"

    await client.send_all(speech("speech_en_single.wav"))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    await client.until("response.output_audio.delta")
    await client.send({"type": "response.cancel"})
    cancelled = await done(client)
    assert cancelled["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}


async def server_vad_turns(client: Client) -> None:
    """A server-VAD turn whose answer the next speech interrupts, then that speech's answer; the
    model transcribes each turn (audio.input.transcription)."""
    await client.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "interrupt_response": True},
        "transcription": {"model": MODEL_NAME}}}}})
    await client.until("session.updated")
    start = len(client.events)
    await client.send_all(speech("speech_en_single.wav", trailing_silence_s=1.0))
    first = (await client.until("response.created"))[-1]["response"]["id"]
    await client.send_all(speech("speech_with_pause.wav", trailing_silence_s=1.0))
    interrupted = await done(client)
    assert (interrupted["id"], interrupted["status_details"]["reason"]) == (first, "turn_detected")
    assert (await done(client))["status"] == "completed"
    transcribed = "conversation.item.input_audio_transcription.completed"
    while sum(e["type"] == transcribed for e in client.events[start:]) < 2:
        await client.until(transcribed)
    committed = [e["item_id"] for e in client.events[start:] if e["type"] == "input_audio_buffer.committed"]
    assert [e["item_id"] for e in client.events[start:] if e["type"] == transcribed] == committed  # one each


def test_a_ga_client_receives_nothing_but_ga_events(server) -> None:
    async def scenario() -> Client:
        client = await connect(server, extensions=False)
        try:
            await client.next()  # session.created
            await conversation_turns(client)
            await server_vad_turns(client)
            await client.send({"type": "session.close"})
            with pytest.raises(websockets.exceptions.ConnectionClosed):
                await client.until("session.closed", timeout=30)  # GA has none: the socket just closes
        finally:
            await client.close()
        return client

    client = asyncio.run(scenario())
    assert client.ws.close_code == 1000 and client.ws.close_reason == "client_close"
    received = [{key: value for key, value in event.items() if key != "_t"} for event in client.events]
    problems = [problem for event in received for problem in ga_problems(event)]
    assert problems == [], json.dumps(problems[:20], indent=1)
    sessions = [event["session"] for event in received if event["type"] in ("session.created", "session.updated")]
    assert len(sessions) >= 2 and {(s["object"], s["id"]) for s in sessions} == {  # as OpenAI's server sends them
        ("realtime.session", sessions[0]["id"])} and sessions[0]["id"].startswith("sess_")
    kinds = {event["type"] for event in received}
    assert {"session.created", "input_audio_buffer.speech_started", "conversation.item.truncated",
            "response.output_audio.delta", "response.output_text.delta", "error",
            "conversation.item.input_audio_transcription.delta"} <= kinds
