"""Eight concurrent server-VAD sessions, three turns each, on the GA lane and on the duplex lane
(speaking in real time): all complete, nothing leaks (engine requests, sessions, duplex
sessions and their journals, server tasks)."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.realtime_helpers import MODEL_NAME, append_events, connect, fixture_pcm, running_server
from tests.test_realtime_ga_lane import SERVER_VAD_UPDATE

SESSIONS, TURNS = 8, 3
TURN_AUDIO = ("speech_en_single.wav", "speech_with_pause.wav", "speech_en_single.wav")


async def one_session(url: str, duplex: bool) -> list[dict]:
    """A duplex session opens by autostart and ends with session.close (a dropped socket
    would leave it waiting for a resume)."""
    client = await connect(url, f"/v1/realtime?model={MODEL_NAME}" if duplex else "/v1/realtime")
    turns = []
    try:
        await client.next()
        await client.send(SERVER_VAD_UPDATE)
        await client.until("session.updated")
        for fixture in TURN_AUDIO[:TURNS]:
            # a duplex client speaks in real time (the turn lane's load is sent back to back)
            await client.stream(append_events(fixture_pcm(fixture, trailing_silence_s=1.5)), realtime=duplex)
            turns.append(await client.until("response.done", timeout=300))
        if duplex:
            await client.close_session()
    finally:
        await client.close()
    return turns


def test_eight_sessions_three_turns(tiny_loaded) -> None:
    overrides = {"stages.1.default_sampling_params.max_tokens": 24}
    with running_server(tiny_loaded, overrides) as (url, engine, app):
        check_concurrent_sessions(url, engine, app)


def test_eight_duplex_sessions_three_turns(tiny_loaded) -> None:
    overrides = {"stages.1.default_sampling_params.max_tokens": 24}
    with running_server(tiny_loaded, overrides, session_mode="duplex") as (url, engine, app):
        check_concurrent_sessions(url, engine, app, duplex=True)


def check_concurrent_sessions(url: str, engine, app, duplex: bool = False) -> None:
    """SESSIONS x TURNS server-VAD turns: all complete with audio, no error event, and
    nothing (requests, sessions, server tasks) outlives its session."""
    async def tasks_on_server() -> int:
        return len(asyncio.all_tasks())

    def server_tasks() -> int:
        return asyncio.run_coroutine_threadsafe(tasks_on_server(), app.state.loop).result(timeout=10)

    baseline = server_tasks()

    async def load():
        return await asyncio.gather(*(one_session(url, duplex) for _ in range(SESSIONS)))

    results = asyncio.run(load())
    for turns in results:
        assert len(turns) == TURNS
        for events in turns:
            assert not any(e["type"] == "error" for e in events), [e for e in events if e["type"] == "error"]
            assert events[-1]["response"]["status"] == "completed"
            assert any(e["type"] == "response.output_audio.delta" for e in events)
    deadline = time.monotonic() + 5
    while engine.num_active_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_active_requests() == 0
    assert len(app.state.duplex_sessions) == 0  # every session (its journal included) is gone
    health = httpx.get(url.replace("ws://", "http://") + "/health").json()
    assert health["active_sessions"] == 0 and health["status"] == "ok"
    metrics = httpx.get(url.replace("ws://", "http://") + "/metrics").text
    assert "vllm_omni_realtime_active_sessions 0.0" in metrics
    assert 'vllm_omni_realtime_responses_total{status="completed"}' in metrics
    deadline = time.monotonic() + 5
    while server_tasks() > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_tasks() <= baseline  # no response, writer or session task outlives its session
