"""Connection rules of the protocol (docs/conformance.md §1) on the wire: what the official SDK
sends is accepted, frames are compact UTF-8 JSON, route selection on a duplex deploy, and how a
duplex session opens (autostart, `resume=1`, the ids the server owns)."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from tests.realtime_helpers import MODEL_NAME, running_server, serving
from vllm_omni.session.base import NativeDuplexSettings

SDK_HEADERS = {"Accept": "application/json", "Content-Type": "application/json",
               "User-Agent": "AsyncOpenAI/Python 3.57.0", "X-Stainless-Lang": "python",
               "X-Stainless-Package-Version": "3.57.0", "X-Stainless-Async": "async:asyncio",
               "OpenAI-Organization": "org-x", "OpenAI-Project": "proj-x"}
NATIVE_MODEL = "minicpmo-tiny"
OBSOLETE_QUERY = "native_duplex=1&session_id=mine&call_id=c1&intent=transcription&whatever=1"


@pytest.fixture(scope="module")
def turn_server(turn_model):
    with running_server(turn_model, {"stages.1.default_sampling_params.max_tokens": 32}) as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def duplex_server(turn_model):
    with running_server(turn_model, {"stages.1.default_sampling_params.max_tokens": 32},
                        session_mode="duplex") as (url, _, _):
        yield url


def assert_compact(raw: str) -> dict:
    """A server frame: one JSON object, compact separators, non-ASCII characters unescaped."""
    event = json.loads(raw)
    assert raw == json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    assert event["type"] != "error", event
    return event


async def test_an_sdk_style_connection_gets_compact_utf8_frames(turn_server) -> None:
    """§1.1, §1.3, §1.4, §1.6, §1.8: SDK headers, no subprotocol, ignored query parameters;
    `session.created` before any client event; compact frames with non-ASCII text unescaped."""
    url = f"{turn_server}/v1/realtime?model={MODEL_NAME}&{OBSOLETE_QUERY}"
    async with websockets.connect(url, additional_headers=SDK_HEADERS) as ws:
        assert ws.subprotocol is None
        assert assert_compact(await ws.recv())["type"] == "session.created"
        text = "héllo wörld, 你好 — ✓"
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
        while (event := assert_compact(raw := await asyncio.wait_for(ws.recv(), 30)))["type"] != \
                "conversation.item.done":
            pass
        assert text in raw and event["item"]["content"][0]["text"] == text
    async with websockets.connect(f"{turn_server}/v1/realtime", subprotocols=["realtime"]) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(await ws.recv())["type"] == "session.created"


async def test_a_chosen_lane_never_changes(turn_server) -> None:
    """§1.2: once the legacy lane is chosen, a GA-shaped update is ignored and a GA event is a
    flat `unknown_event`; once the GA lane is chosen, a flat update is a GA update of `model`."""
    async with websockets.connect(turn_server + "/v1/realtime") as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "model": MODEL_NAME}))
        await ws.send(json.dumps({"type": "session.update", "model": MODEL_NAME, "session": {"instructions": "x"}}))
        await ws.send(json.dumps({"type": "response.create"}))
        error = json.loads(await asyncio.wait_for(ws.recv(), 30))  # nothing answered the two updates
        assert (error["type"], error["code"]) == ("error", "unknown_event") and isinstance(error["error"], str)
    async with websockets.connect(turn_server + "/v1/realtime") as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "response.cancel", "event_id": "c1"}))
        error = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert error["error"]["event_id"] == "c1"  # the GA shape: the lane is GA
        await ws.send(json.dumps({"type": "session.update", "model": MODEL_NAME}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "session.updated"

async def test_a_duplex_deploy_routes_by_path_and_query(duplex_server) -> None:
    """§1.1: on a duplex deploy a false `duplex` query gets the flat `unsupported` error;
    `/v1/duplex` always selects the duplex handler."""
    async with websockets.connect(f"{duplex_server}/v1/realtime?duplex=0") as ws:
        error = json.loads(await ws.recv())
        assert (error["type"], error["code"]) == ("error", "unsupported")
        assert error["error"] == "Realtime API is not available"
        await asyncio.wait_for(ws.wait_closed(), 10)
    async with websockets.connect(f"{duplex_server}/v1/duplex?model={MODEL_NAME}&duplex=0") as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"


async def test_a_duplex_session_opens_as_the_client_says(duplex_server) -> None:
    """§1.3 `resume=1` disables autostart and `session_id` is ignored; §1.8 `session.created`
    then `session.updated` with the same object; §1.11 resume credentials and sequence numbers."""
    async with websockets.connect(f"{duplex_server}/v1/realtime?model={MODEL_NAME}&resume=1&{OBSOLETE_QUERY}") as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}}))
        created = assert_compact(await asyncio.wait_for(ws.recv(), 30))
        updated = assert_compact(await asyncio.wait_for(ws.recv(), 30))
    assert (created["type"], updated["type"]) == ("session.created", "session.updated")
    assert created["session"]["instructions"] == "Be brief."  # no autostart opened it first
    assert created["session"] == updated["session"]
    assert created["session"]["id"].startswith("duplex-") and created["session"]["id"] != "mine"
    assert created["attachment_generation"] == 1
    token = created["resume_token"]
    assert len(token) == 43 and token.replace("-", "").replace("_", "").isalnum()
    assert "server_event_seq" not in created and updated["server_event_seq"] == 1


@pytest.fixture(scope="module")
def native_server(minicpmo_vllm_engine):
    """MiniCPM-o on its vLLM deploy, the engine shared with the other native modules."""
    with serving(minicpmo_vllm_engine, model_name=NATIVE_MODEL, session_mode="duplex",
                 native_duplex=NativeDuplexSettings(), borrowed=True) as (url, _, _):
        yield url


async def test_an_autostart_the_native_model_cannot_open_waits_for_the_first_message(native_server) -> None:
    """§1.3: `?model=` autostarts, MiniCPM-o needs `ref_audio` for audio output, so instead of
    reporting `ref_audio_required` the server waits for the first message (a stock GA client
    always sends `model`)."""
    async with websockets.connect(f"{native_server}/v1/realtime?model={NATIVE_MODEL}") as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"modalities": ["text"],
                                                                        "instructions": "Listen."}}))
        created = assert_compact(await asyncio.wait_for(ws.recv(), 60))
        assert created["type"] == "session.created" and created["session"]["instructions"] == "Listen."
        assert created["session"]["capabilities"]["implementation_level"] == "model_native_duplex"
    async with websockets.connect(f"{native_server}/v1/realtime?resume=1") as ws:  # §1.11: the native session resumes
        await ws.send(json.dumps({"type": "session.resume", "session_id": created["session"]["id"],
                                  "resume_token": created["resume_token"]}))
        resumed = json.loads(await asyncio.wait_for(ws.recv(), 60))
        assert (resumed["type"], resumed["session_id"]) == ("session.resumed", created["session"]["id"])
        await ws.send(json.dumps({"type": "session.close"}))


async def test_the_native_model_refuses_a_text_only_turn(native_server) -> None:
    """§3.9: only text items pending and a model without `supports_text_only_turn` →
    `text_only_turn_unsupported`."""
    async with websockets.connect(f"{native_server}/v1/realtime?autostart=0") as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"model": NATIVE_MODEL,
                                                                        "modalities": ["text"]}}))
        created = json.loads(await asyncio.wait_for(ws.recv(), 60))
        assert created["session"]["capabilities"]["supports_text_only_turn"] is False
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello."}]}}))
        await ws.send(json.dumps({"type": "response.create", "event_id": "r1"}))
        while (event := json.loads(await asyncio.wait_for(ws.recv(), 60)))["type"] not in ("error", "response.done"):
            pass
        assert event["type"] == "error", "the text-only turn was answered"
        assert (event["error"]["code"], event["error"]["event_id"]) == ("text_only_turn_unsupported", "r1")
        await ws.send(json.dumps({"type": "session.close"}))


async def test_a_silent_duplex_socket_is_closed_and_its_session_resumable(duplex_server) -> None:
    """§1.9: no client message for `idle_timeout_s` → close 1000 `idle_timeout`; the session
    enters its disconnect grace and resumes."""
    async with websockets.connect(f"{duplex_server}/v1/realtime?autostart=0") as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"idle_timeout_s": 1}}))
        created = json.loads(await ws.recv())
        await asyncio.wait_for(ws.wait_closed(), 30)
        assert (ws.close_code, ws.close_reason) == (1000, "idle_timeout")
    async with websockets.connect(f"{duplex_server}/v1/realtime?resume=1") as ws:
        await ws.send(json.dumps({"type": "session.resume", "session_id": created["session"]["id"],
                                  "resume_token": created["resume_token"]}))
        resumed = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert resumed["type"] == "session.resumed" and resumed["attachment_generation"] == 2
        await ws.send(json.dumps({"type": "session.close"}))
