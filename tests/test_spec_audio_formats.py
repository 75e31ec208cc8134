"""Audio formats on the wire (docs/realtime-api.md §3, docs/conformance.md §7) against a real
server: every input spelling, rates and their limits, whole samples and strict base64, and what
each output format delivers in its deltas."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import wave

import numpy as np
import pytest

from tests.realtime_helpers import MODEL_NAME, Client, connect, fixture_pcm, running_server
from vllm_omni.client.streaming import append_events

SPELLINGS = {  # canonical name: its accepted spellings
    "pcm16": ["pcm16", "PCM_S16LE", "s16le", "pcm", "audio/pcm", "audio/pcm16"],
    "pcm_f32le": ["pcm_f32le", "f32le", "audio/pcm_f32le"],
    "g711_ulaw": ["g711_ulaw", "g711-ulaw", "ulaw", "mulaw", "audio/g711_ulaw", "audio/pcmu"],
    "g711_alaw": ["g711_alaw", "g711-alaw", "alaw", "audio/g711_alaw", "audio/pcma"],
}


@pytest.fixture(scope="module")
def server(turn_model):
    overrides = {"stages.1.default_sampling_params.max_tokens": 24}
    with running_server(turn_model, overrides) as (url, _, _):
        yield url


async def session(url: str) -> Client:
    client = await connect(url)
    assert (await client.next())["type"] == "session.created"
    await client.send({"type": "session.update", "session": {"model": MODEL_NAME, "turn_detection": None}})
    assert (await client.next())["type"] == "session.updated"
    return client


async def reply(client: Client, event: dict) -> dict:
    """The next event after `event` (an update's session.updated, or an error); sent as text, so
    that the client library does not read a broken append's audio itself."""
    await client.send(json.dumps(event))
    return await client.next()


def test_every_input_spelling_is_accepted_and_others_are_refused(server) -> None:
    """§7.1: each spelling family (string and object, with a rate) is accepted; wav and compressed
    codecs are unsupported_audio_format; a rate outside 8000-192000 or fractional is bad_event."""
    async def scenario():
        client = await session(server)
        for names in SPELLINGS.values():
            for name in names:
                for form in (name, {"type": name, "rate": 16000}, {"format": name, "sample_rate_hz": 16000}):
                    answer = await reply(client, {"type": "session.update", "session": {"input_audio_format": form}})
                    assert answer["type"] == "session.updated", (form, answer)
        for name in ("wav", "mp3", "opus"):
            answer = await reply(client, {"type": "session.update", "session": {"input_audio_format": name}})
            assert answer["error"]["code"] == "unsupported_audio_format", answer
        for rate in (7999, 192001, 16000.5):
            answer = await reply(client, {"type": "input_audio_buffer.append", "sample_rate_hz": rate,
                                          "audio": base64.b64encode(b"\0\0" * 160).decode()})
            assert answer["error"]["code"] == "bad_event", (rate, answer)
        await client.close()

    asyncio.run(scenario())


def test_appends_need_whole_samples_and_strict_base64(server) -> None:
    """§7.4: PCM16 needs an even byte count, float32 a multiple of 4; base64 with a data-URL prefix
    or line breaks is bad_audio; a refused append adds nothing (the commit then finds it empty)."""
    async def scenario():
        client = await session(server)
        pcm = base64.b64encode(b"\0\0" * 320).decode()
        bad = [{"audio": base64.b64encode(b"\0" * 3).decode()},
               {"audio": base64.b64encode(b"\0" * 6).decode(), "input_audio_format": "pcm_f32le"},
               {"audio": "data:audio/pcm;base64," + pcm},
               {"audio": pcm[:40] + "\n" + pcm[40:]}]
        for fields in bad:
            answer = await reply(client, {"type": "input_audio_buffer.append", **fields})
            assert answer["error"]["code"] == "bad_audio", (fields, answer)
        answer = await reply(client, {"type": "input_audio_buffer.commit"})
        assert answer["error"]["code"] == "input_audio_buffer_commit_empty"
        await client.close()

    asyncio.run(scenario())


def test_rates_are_converted_and_a_rate_change_is_refused(server) -> None:
    """§7.2: a second of 24 kHz PCM16, of 8 kHz mu-law and of 48 kHz float32 each becomes a
    committed turn (a heuristic speech_stopped, when sent, ends at 1000 ms of the 16 kHz timeline);
    an append at another rate before the commit is bad_event and adds nothing."""
    t = np.arange(48000) / 48000
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    seconds = [{"audio": base64.b64encode((tone[::2] * 32767).astype("<i2").tobytes()).decode(),
                "sample_rate_hz": 24000},
               {"audio": base64.b64encode(bytes(range(256)) * 31 + bytes(64)).decode(),
                "input_audio_format": "g711_ulaw"},
               {"audio": base64.b64encode(tone.astype("<f4").tobytes()).decode(),
                "input_audio_format": "pcm_f32le", "sample_rate_hz": 48000}]

    async def scenario():
        for fields in seconds:
            client = await session(server)
            await client.send({"type": "input_audio_buffer.append", **fields})
            other = {**seconds[0], "sample_rate_hz": 22050}  # none of the seconds is at 22.05 kHz
            answer = await reply(client, {"type": "input_audio_buffer.append", **other})
            if answer["type"] != "error":  # a heuristic speech_started for the first second
                answer = await client.next()
            assert answer["error"]["code"] == "bad_event"
            await client.send({"type": "input_audio_buffer.commit"})
            events = await client.until("conversation.item.done")
            assert not [e for e in events if e["type"] == "error"], [e["error"] for e in events if e["type"] == "error"]
            stopped = [e for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
            assert all(e["audio_end_ms"] == 1000 for e in stopped)  # the refused append added nothing
            await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(("requested", "delivered", "rate"), [
    ("pcm16", "pcm16", 24000), ("audio/pcm", "pcm16", 24000), ("wav", "wav", 24000),
    ("g711_ulaw", "g711_ulaw", 8000), ("audio/pcmu", "g711_ulaw", 8000), ("audio/pcma", "g711_alaw", 8000)])
def test_each_output_format_is_what_its_deltas_carry(server, requested, delivered, rate) -> None:
    """§7.3: the delivered format and rate on every delta (constant within the response), the
    bytes matching it (WAV: a whole RIFF file per delta; PCM16 even; G.711 one byte a sample), and
    the cumulative duration matching the bytes."""
    async def scenario():
        client = await session(server)
        await client.send({"type": "session.update", "session": {"output_audio_format": requested}})
        assert (await client.next())["type"] == "session.updated"
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav"), chunk_ms=100))
        await client.send({"type": "input_audio_buffer.commit", "create_response": True})
        turn = await client.until("response.done")
        assert "error" not in [e["type"] for e in turn]
        deltas = [e for e in turn if e["type"] == "response.output_audio.delta"]
        assert deltas and {(d["vllm_omni"]["format"], d["vllm_omni"]["sample_rate_hz"]) for d in deltas} == {
            (delivered, rate)}
        samples = 0
        for delta in deltas:
            data = base64.b64decode(delta["delta"], validate=True)
            if delivered == "wav":
                with wave.open(io.BytesIO(data)) as wav:
                    assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (rate, 1, 2)
                    samples += wav.getnframes()
            else:
                width = 2 if delivered == "pcm16" else 1
                assert len(data) % width == 0
                samples += len(data) // width
            assert delta["vllm_omni"]["audio_duration_ms"] == samples * 1000 // rate
        await client.close()

    asyncio.run(scenario())


def test_an_unsupported_output_format_is_refused_at_update_and_at_response(server) -> None:
    """§7.3: mp3 or pcm_f32le output → unsupported_audio_format, at session.update and at response.create."""
    async def scenario():
        client = await session(server)
        for name in ("mp3", "pcm_f32le"):
            answer = await reply(client, {"type": "session.update", "session": {"output_audio_format": name}})
            assert answer["error"]["code"] == "unsupported_audio_format"
        await client.send({"type": "response.create", "response": {"output_audio_format": "mp3"}})
        assert (await client.until("error"))[-1]["error"]["code"] == "unsupported_audio_format"
        await client.close()

    asyncio.run(scenario())


def test_a_change_to_or_from_16_khz_is_refused_too(server) -> None:
    """§7.2: 24 kHz then 16 kHz in one session → bad_event (as 24 kHz then 22.05 kHz is)."""
    async def scenario():
        client = await session(server)
        tone = base64.b64encode((np.sin(np.arange(4800) / 5) * 8000).astype("<i2").tobytes()).decode()
        await client.send({"type": "input_audio_buffer.append", "audio": tone, "sample_rate_hz": 24000})
        await client.send({"type": "input_audio_buffer.append", "audio": tone, "sample_rate_hz": 16000})
        await client.send({"type": "session.heartbeat"})
        events = await client.until("session.heartbeat_ack")
        await client.close()
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["bad_event"]

    asyncio.run(scenario())
