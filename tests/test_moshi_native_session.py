"""Moshi natively full duplex on the wire (docs/moshi.md, "Frames on the wire"), against a real
server on the tiny checkpoint: one unit per 80 ms frame, the model's frames on the wire byte for
byte, a barge-in that closes its turn in its own stream, resume after a dropped socket with
byte-identical audio, and close (the real-time load: tests/test_moshi_realtime_load.py)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import pytest

from tests.realtime_helpers import Client, fixture_pcm, serving
from vllm_omni.audio.pcm import pcm16_to_float
from vllm_omni.client.duplex import DuplexConnection
from vllm_omni.client.native_duplex import native_opening
from vllm_omni.client.streaming import UnitGrid, append_events
from vllm_omni.engine.native_duplex import DuplexOpening
from vllm_omni.session.base import NativeDuplexSettings

MODEL = "moshi-tiny"
FRAME_MS = 80
CONTINUATION_LIMIT = 4
GRID = UnitGrid(FRAME_MS, FRAME_MS)


@pytest.fixture(scope="module")
def server(moshi_engine):
    settings = NativeDuplexSettings(allow_test_decisions=True, continuation_limit_units=CONTINUATION_LIMIT,
                                    continuation_period_ms=FRAME_MS)
    with serving(moshi_engine, model_name=MODEL, session_mode="duplex", native_duplex=settings, max_sessions=4,
                 borrowed=True) as (url, engine, _):
        yield url, engine


def opening(**extra_body: Any) -> dict[str, Any]:
    return native_opening(model=MODEL, own_voice=True, **extra_body)


def speech(frames: int) -> bytes:
    return fixture_pcm("speech_en_single.wav")[: 2 * 16 * FRAME_MS * frames]


def no_errors(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    errors = [e for e in events if e["type"] == "error"]
    assert not errors, errors
    return events


def audio_of(events: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")


async def model_frames(engine, pcm: bytes, script: list[str]) -> list:
    """The model's own decisions for `pcm`, then the continuation's silence frames (the last
    forced), straight from the unit model: what the wire must carry."""
    session = await engine.model.open(DuplexOpening(settings={"duplex_test_decisions": script}))
    decisions = await session.append(pcm16_to_float(pcm), [], False)
    silence = np.zeros(16 * FRAME_MS, np.float32)
    for index in range(CONTINUATION_LIMIT):
        decisions += await session.append(silence, [], index == CONTINUATION_LIMIT - 1)
    await session.close()
    return decisions


async def test_every_frame_is_a_unit_and_the_wire_carries_the_model_frames(server) -> None:
    url, engine = server
    script = ["listen"] * 4
    conn = await DuplexConnection.start(f"{url}/v1/realtime", opening=opening(duplex_test_decisions=script))
    capabilities = conn.capabilities
    assert (capabilities["implementation_level"], capabilities["chunk_period_ms"], capabilities["first_chunk_ms"]) \
        == ("model_native_duplex", FRAME_MS, FRAME_MS)
    pcm = speech(14)
    await conn.send_all(append_events(pcm, chunk_ms=30))  # appends never line up with the frames
    events = no_errors(await conn.until("response.done", timeout=60))
    expected = await model_frames(engine, pcm, script)
    listens = [e for e in events if e["type"] == "response.listen"]
    assert [e["response"]["metadata"]["reason"] for e in listens] == ["model_listen"] * 4 + ["continuation_limit"]
    kinds = [e["type"] for e in events]
    assert kinds.index("response.speak") > kinds.index("response.listen")
    assert audio_of(events) == b"".join(d.audio for d in expected)
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert transcript == "".join(d.text for d in expected) and transcript.strip()
    done = events[-1]["response"]
    assert done["status"] == "completed"  # the continuation limit's forced listen closed the turn
    assert all(e["sample_rate_hz"] == 24000 for e in events if e["type"] == "response.output_audio.delta")
    await conn.close_session()


@pytest.mark.parametrize("interrupt", ["overlap_action", "input.cancel"])
async def test_a_barge_in_closes_the_model_turn_in_its_own_stream(server, interrupt: str) -> None:
    url, _ = server
    client = await Client.open(f"{url}/v1/realtime?duplex=1&autostart=0")
    await client.send(opening(duplex_test_decisions=["listen"] * 2))
    no_errors(await client.until("session.updated", timeout=30))
    appends = append_events(speech(12), chunk_ms=FRAME_MS)
    await client.send_all(appends[:4])
    spoken = no_errors(await client.until("response.output_audio.delta", timeout=30))
    response_id = next(e for e in spoken if e["type"] == "response.speak")["response_id"]
    if interrupt == "overlap_action":
        await client.send({**appends[4], "overlap_action": "barge_in"})
    else:  # the client drops its input and stops the answer
        await client.send({"type": "input.cancel"})
        await client.send(appends[4])
    cancelled = no_errors(await client.until("response.done", timeout=30))
    assert cancelled[-1]["response"]["status"] == "cancelled" and cancelled[-1]["response"]["id"] == response_id
    await client.send_all(appends[5:])
    after = no_errors(await client.until("response.listen", timeout=30))  # the forced frame: quiet in its stream
    assert "response_id" not in after[-1]
    assert all(e.get("response_id") != response_id for e in after)
    speaks_again = no_errors(await client.until("response.speak", timeout=30))  # a model that always talks
    assert speaks_again[-1]["response_id"] != response_id
    await client.close_session()


async def test_a_dropped_socket_resumes_with_byte_identical_audio(server) -> None:
    url, engine = server
    pcm = speech(20)
    appends = append_events(pcm, chunk_ms=FRAME_MS)

    async def heard(drop_after_deltas: int | None) -> bytes:
        conn = await DuplexConnection.start(f"{url}/v1/realtime", opening=opening())
        await conn.send_all(appends)
        events: list[dict[str, Any]] = []
        if drop_after_deltas is not None:
            while sum(e["type"] == "response.output_audio.delta" for e in events) < drop_after_deltas:
                events.append(await conn.next(30))
            resumed = await conn.resume()  # the old socket is dropped; the journal replays what it missed
            assert resumed["type"] == "session.resumed" and resumed["attachment_generation"] == 2
        events += await conn.until("response.done", timeout=60)
        no_errors(events)
        await conn.close_session()
        return audio_of(events)

    straight = await heard(None)
    assert await heard(5) == straight
    assert straight == b"".join(d.audio for d in await model_frames(engine, pcm, []))


async def test_close_ends_the_session_and_frees_its_slot(server) -> None:
    url, engine = server
    pool = engine.model.loop.temporal.pool
    free = len(pool.free)
    client = await Client.open(f"{url}/v1/realtime?duplex=1&autostart=0")
    await client.send(opening())
    await client.until("session.updated", timeout=30)
    await client.send_all(append_events(speech(3), chunk_ms=FRAME_MS))
    no_errors(await client.until("response.speak", timeout=30))
    await client.close_session()
    for _ in range(100):
        if engine.open_streams == 0 and len(pool.free) == free:
            break
        await asyncio.sleep(0.05)
    assert engine.open_streams == 0 and len(pool.free) == free
