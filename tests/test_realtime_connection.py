"""Connection-level behaviour: API key, subprotocol, idle timeout, maximum session duration."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import websockets

from tests.realtime_helpers import MODEL_NAME, running_server
from vllm_omni.client.connection import RealtimeConnection

KEY = "s3cret"


@pytest.fixture(scope="module")
def guarded(tiny_loaded):
    with running_server(tiny_loaded, {}, api_key=KEY, max_session_duration_s=3.0) as (url, _, _):
        yield url


def test_api_key_is_required(guarded) -> None:
    async def scenario():
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            await RealtimeConnection.open(guarded + "/v1/realtime")
        assert refused.value.response.status_code == 401
        conn = await RealtimeConnection.open(guarded + "/v1/realtime",
                                             headers={"Authorization": f"Bearer {KEY}"})
        assert (await conn.next())["type"] == "session.created"
        await conn.close()
        # Browsers cannot set headers: the key may come as a subprotocol offer.
        ws = await websockets.connect(guarded + "/v1/realtime",
                                      subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"])
        assert ws.subprotocol == "realtime"
        await ws.close()

    asyncio.run(scenario())


def test_models_and_health(guarded) -> None:
    base = guarded.replace("ws://", "http://")
    models = httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert models.json()["data"][0]["id"] == MODEL_NAME
    assert httpx.get(base + "/health").json()["status"] == "ok"  # open, for load balancers
    assert httpx.get(base + "/metrics").status_code == 200  # open unless --protect-metrics


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_every_v1_route_refuses_a_missing_or_wrong_key(guarded, headers) -> None:
    base = guarded.replace("ws://", "http://")
    for path in ("/v1/models", "/v1/chat/completions", "/v1/anything"):
        refused = httpx.get(base + path, headers=headers)
        assert refused.status_code == 401, path
        assert refused.json()["error"]["code"] == "invalid_api_key", path

    async def sockets():
        for path in ("/v1/realtime", "/v1/duplex"):  # refused at the upgrade: no socket is accepted
            with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
                await websockets.connect(guarded + path, additional_headers=headers)
            assert refused.value.response.status_code == 401, path

    asyncio.run(sockets())


def test_metrics_can_require_the_key(tiny_loaded) -> None:
    with running_server(tiny_loaded, {}, api_key=KEY, protect_metrics=True) as (url, _, _):
        base = url.replace("ws://", "http://")
        assert httpx.get(base + "/metrics").status_code == 401
        assert httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert httpx.get(base + "/health").status_code == 200


def test_idle_timeout_closes_the_session(guarded) -> None:
    async def scenario():
        conn = await RealtimeConnection.open(guarded + "/v1/realtime", headers={"Authorization": f"Bearer {KEY}"})
        await conn.next()
        await conn.send({"type": "session.update", "session": {"idle_timeout_s": 0.5}})
        await conn.until("session.updated")
        closed = await conn.until("session.closed", timeout=10)
        assert closed[-1]["reason"] == "idle_timeout"
        await asyncio.sleep(0.1)
        assert conn.ws.close_code == 1000

    asyncio.run(scenario())


def test_without_extensions_a_session_ends_by_its_close_frame_alone(guarded) -> None:
    """GA has no `session.closed`: a client that did not ask for extensions sees the socket close."""
    async def scenario():
        conn = await RealtimeConnection.open(guarded + "/v1/realtime", headers={"Authorization": f"Bearer {KEY}"},
                                             extensions=False)
        await conn.next()
        await conn.send({"type": "session.update", "session": {"idle_timeout_s": 0.5}})
        await conn.until("session.updated")
        with pytest.raises(websockets.exceptions.ConnectionClosed):
            await conn.until("session.closed", timeout=10)
        assert (conn.ws.close_code, conn.ws.close_reason) == (1000, "idle_timeout")
        assert [e["type"] for e in conn.events] == ["session.created", "session.updated"]

    asyncio.run(scenario())


def test_maximum_session_duration(guarded) -> None:
    async def scenario():
        conn = await RealtimeConnection.open(guarded + "/v1/realtime", headers={"Authorization": f"Bearer {KEY}"})
        await conn.next()
        try:
            for _ in range(20):  # keep the session busy, so only the duration limit can end it
                await conn.send({"type": "session.heartbeat"})
                await asyncio.sleep(0.5)
        except websockets.exceptions.ConnectionClosed:
            pass
        closed = await conn.until("session.closed", timeout=10)  # buffered events are still readable
        assert closed[-1]["reason"] == "max_duration"

    asyncio.run(scenario())


def test_duplex_query_is_refused_in_turn_mode(guarded) -> None:
    async def scenario():
        conn = await RealtimeConnection.open(guarded + "/v1/realtime?duplex=1",
                                             headers={"Authorization": f"Bearer {KEY}"})
        error = await conn.next()
        assert error == {"type": "error", "code": "unsupported", "error": "VAD realtime is not enabled",
                         "_t": error["_t"]}
        with pytest.raises(websockets.exceptions.ConnectionClosed):
            await conn.next(timeout=5)
        assert conn.ws.close_code == 1008

    asyncio.run(scenario())


def test_a_closed_session_frees_its_slot_before_session_closed(tiny_loaded) -> None:
    """With one slot: close a session, and open the next as soon as `session.closed` arrives."""
    async def scenario(url: str):
        for _ in range(3):
            conn = await RealtimeConnection.open(url + "/v1/realtime")
            assert (await conn.next())["type"] == "session.created"
            await conn.send({"type": "session.close"})
            await conn.until("session.closed")
        refused_while_open = await RealtimeConnection.open(url + "/v1/realtime")
        await refused_while_open.next()
        second = await RealtimeConnection.open(url + "/v1/realtime")
        event = await second.next()
        assert event["type"] == "error" and event["error"]["code"] == "resource_exhausted"
        await refused_while_open.close()

    with running_server(tiny_loaded, {}, max_sessions=1) as (url, _, _):
        asyncio.run(scenario(url))
