"""The seed turn-mode client (legacy lane, docs/realtime-api.md §1.2, §8.3) against a real server."""

from __future__ import annotations

import asyncio
import base64

import pytest

from tests.realtime_helpers import MODEL_NAME, Client, append_events, connect, fixture_pcm, running_server

LEGACY_VOCABULARY = {"session.created", "transcription.delta", "transcription.done",
                     "response.output_audio.delta", "response.output_audio.done", "error"}


@pytest.fixture(scope="module")
def async_server(tiny_loaded):
    with running_server(tiny_loaded, {"stages.1.default_sampling_params.max_tokens": 96}) as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def sync_server(tiny_loaded):
    with running_server(tiny_loaded, {"async_chunk": False,
                                      "stages.1.default_sampling_params.max_tokens": 96}) as (url, _, _):
        yield url


async def legacy_turn(url: str, delay: float) -> tuple[Client, dict]:
    client = await connect(url)
    try:
        assert (await client.next())["type"] == "session.created"
        await client.send({"type": "session.update", "model": MODEL_NAME})
        await client.send({"type": "input_audio_buffer.commit", "final": False})
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav")), delay=delay)
        await client.send({"type": "input_audio_buffer.commit", "final": True})
        events = await client.until("response.output_audio.done", timeout=180)
    finally:
        await client.close()
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "response.output_audio.delta")
    text = "".join(e["delta"] for e in events if e["type"] == "transcription.delta")
    done = next(e for e in events if e["type"] == "transcription.done")
    return client, {"events": events, "audio": audio, "text": text, "done": done}


def check_legacy_output(client: Client, result: dict) -> None:
    kinds = [e["type"] for e in client.events]
    assert set(kinds) <= LEGACY_VOCABULARY and "error" not in kinds
    deltas = [e for e in result["events"] if e["type"] == "response.output_audio.delta"]
    assert len(deltas) >= 1 and all(e["sample_rate_hz"] > 0 and e["format"] == "pcm16" for e in deltas)
    assert len(result["audio"]) >= 4096 and len(result["audio"]) % 2 == 0
    assert result["text"] and result["text"] == result["done"]["text"]
    assert result["done"]["usage"]["prompt_tokens"] > 0
    assert kinds[-2:] == ["transcription.done", "response.output_audio.done"]
    assert result["events"][-1]["has_audio"] is True


def test_legacy_smoke_async_chunk_paced(async_server) -> None:
    client, result = asyncio.run(legacy_turn(async_server, delay=0.02))
    check_legacy_output(client, result)
    assert sum(e["type"] == "response.output_audio.delta" for e in result["events"]) > 1  # streamed


def test_legacy_async_chunk_off_no_delay(sync_server) -> None:
    client, result = asyncio.run(legacy_turn(sync_server, delay=0.0))
    check_legacy_output(client, result)


def test_legacy_long_answer_completes(tiny_loaded) -> None:
    long_answer = {"stages.1.default_sampling_params.max_tokens": 160,
                   "stages.1.default_sampling_params.min_tokens": 100}  # 8 s of speech at least
    with running_server(tiny_loaded, long_answer) as (url, _, _):
        client, result = asyncio.run(legacy_turn(url, delay=0.0))
    check_legacy_output(client, result)
    assert len(result["audio"]) / 2 / 24000 > 5.0


def test_legacy_errors_keep_the_connection(async_server) -> None:
    async def scenario():
        client = await connect(async_server)
        try:
            await client.next()
            await client.send({"type": "session.update", "model": "no-such-model"})  # selects the legacy lane
            assert (await client.next())["code"] == "model_not_found"
            await client.send({"type": "input_audio_buffer.commit", "final": False})
            assert (await client.next())["code"] == "model_not_validated"
            await client.send({"type": "session.update", "model": MODEL_NAME})
            await client.send({"type": "input_audio_buffer.append", "audio": "%%%"})
            assert (await client.next()) | {"_t": 0} == {"type": "error", "error": "Invalid audio data",
                                                        "code": "invalid_audio", "_t": 0}
            await client.send({"type": "response.create"})
            assert (await client.next())["code"] == "unknown_event"
        finally:
            await client.close()

    asyncio.run(scenario())
