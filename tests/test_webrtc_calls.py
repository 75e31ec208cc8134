"""WebRTC calls (`POST /v1/realtime/calls`, docs/realtime-api.md §15) against a real server on
the tiny Qwen3-Omni deploy, with an aiortc client as a browser would be: an Opus microphone
track playing a fixture's speech, the `oai-events` data channel, the model's speech heard on
the answer's track: a spoken turn, three turns with a barge-in, and the same answers as over a
WebSocket. Bad offers, a missing key and a peer that never connects or leaves end cleanly with
the session slot freed."""

from __future__ import annotations

import asyncio
import base64
import json
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import pytest

from tests.realtime_helpers import MODEL_NAME, fixture_pcm, running_server
from vllm_omni.audio.pcm import StreamingResampler, float_to_pcm16, pcm16_to_float, resample
from vllm_omni.audio.rtc_tracks import TRACK_RATE, SpeakerTrack
from vllm_omni.client.connection import RealtimeConnection as Client
from vllm_omni.client.webrtc_call import CallPeer

API_KEY = "test-key"
SESSION = {"type": "realtime", "model": MODEL_NAME, "instructions": "Answer briefly."}


@pytest.fixture(scope="module")
def server(tiny_loaded):
    overrides = {"stages.1.default_sampling_params.max_tokens": 64,
                 "stages.1.default_sampling_params.min_tokens": 40}
    with running_server(tiny_loaded, overrides, api_key=API_KEY, webrtc_connect_timeout_s=2.0) as (url, engine, _):
        yield url.replace("ws://", "http://"), engine


def speech_at_track_rate(name: str) -> np.ndarray:
    """A 16 kHz fixture as int16 samples at the track's 48 kHz."""
    return float_to_pcm16(resample(pcm16_to_float(fixture_pcm(name, trailing_silence_s=1.0)), 16000, TRACK_RATE))


class Caller(CallPeer):
    """The client library's call peer (client/webrtc_call.py), also keeping the samples it heard."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[np.ndarray] = []

    async def _on_audio(self, samples: np.ndarray, rate: int) -> None:
        await super()._on_audio(samples, rate)
        self.samples.append(samples)

    def loud_heard(self) -> int:
        """Samples heard louder than silence."""
        return int((np.abs(np.concatenate(self.samples)) > 1e-3).sum()) if self.samples else 0


@asynccontextmanager
async def call(base: str, session: dict[str, Any] | None = SESSION):
    caller = Caller()
    offer = await caller.offer()
    files = {"sdp": (None, offer)} | ({"session": (None, json.dumps(session))} if session is not None else {})
    async with httpx.AsyncClient() as http:
        answered = await http.post(f"{base}/v1/realtime/calls", files=files,
                                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert answered.status_code == 201, answered.text
    assert answered.headers["content-type"].startswith("application/sdp")
    assert answered.headers["location"].startswith("/v1/realtime/calls/rtc_")
    await caller.accept(answered.text)
    try:
        yield caller
    finally:
        await caller.close()


async def active_sessions(base: str) -> int:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{base}/health")).json()["active_sessions"]


async def until_no_session(base: str, timeout_s: float = 15.0) -> None:
    async with asyncio.timeout(timeout_s):
        while await active_sessions(base):
            await asyncio.sleep(0.1)


def test_a_spoken_turn_over_webrtc_is_answered_on_the_track(server) -> None:
    base, _ = server

    async def scenario():
        async with call(base) as caller:
            created = await caller.until("session.created")
            assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            updated = await caller.until("session.updated")  # the call's session object, applied
            assert updated["session"]["instructions"] == "Answer briefly."
            caller.microphone.push("question", "question", speech_at_track_rate("speech_en_single.wav"))
            await caller.until("input_audio_buffer.speech_started")
            await caller.until("input_audio_buffer.committed")
            done = await caller.until("response.done")
            started = await caller.until("output_audio_buffer.started")
            stopped = await caller.until("output_audio_buffer.stopped", timeout_s=60)
            assert started["response_id"] == stopped["response_id"] == done["response"]["id"]
            assert done["response"]["status"] == "completed"
            kinds = [event["type"] for event in caller.events]
            assert "response.output_audio.delta" not in kinds  # the audio is on the track
            assert "response.output_audio_transcript.delta" in kinds
            assert [e for e in caller.events if e["type"] == "error"] == []
            assert caller.loud_heard() > TRACK_RATE // 10  # speech heard on the track
        await until_no_session(base)

    asyncio.run(scenario())


def test_three_turns_with_a_barge_in(server) -> None:
    """A question answered and heard to its end; a second question whose answer the third one
    interrupts: the track is cleared, the item truncated to what was played, and the third
    question answered; no error event."""
    base, _ = server

    async def scenario():
        async with call(base) as caller:
            await caller.until("session.updated")
            caller.microphone.push("first", "first", speech_at_track_rate("speech_en_single.wav"))
            first = await caller.until("response.done")
            assert first["response"]["status"] == "completed"
            await caller.until("output_audio_buffer.stopped", timeout_s=60)  # heard to its end
            after = len(caller.events)
            caller.microphone.push("second", "second", speech_at_track_rate("speech_en_single.wav"))
            started = await caller.until("output_audio_buffer.started", after=after)
            await asyncio.sleep(0.3)  # some of the answer plays
            after = len(caller.events)
            caller.microphone.push("third", "third", speech_at_track_rate("speech_en_single.wav"))
            cleared = await caller.until("output_audio_buffer.cleared", after=after)
            assert cleared["response_id"] == started["response_id"]
            truncated = await caller.until("conversation.item.truncated", after=after)
            assert 0 < truncated["audio_end_ms"] < 10_000
            third = await caller.until("response.done", after=len(caller.events))
            assert third["response"]["status"] == "completed"
            await caller.until("output_audio_buffer.stopped", after=len(caller.events), timeout_s=60)
            committed = [e for e in caller.events if e["type"] == "input_audio_buffer.committed"]
            assert len(committed) == 3
            assert [e for e in caller.events if e["type"] == "error"] == []
        await until_no_session(base)

    asyncio.run(scenario())


def test_a_call_and_a_socket_give_the_same_answers(server, monkeypatch) -> None:
    """The same two text turns in a call and over a WebSocket: the same transcripts, and the
    call's track gets the socket's PCM (resampled to the track's 48 kHz) before Opus encodes it."""
    base, _ = server
    pushed: dict[str, list[np.ndarray]] = {}
    push = SpeakerTrack.push

    def recording_push(track: SpeakerTrack, response_id: str, item_id: str, samples: np.ndarray) -> None:
        pushed.setdefault(response_id, []).append(samples.copy())
        push(track, response_id, item_id, samples)

    monkeypatch.setattr(SpeakerTrack, "push", recording_push)
    questions = ["Hello there.", "Tell me more."]

    async def over_the_call() -> tuple[list[str], list[np.ndarray]]:
        transcripts, audio = [], []
        async with call(base) as caller:
            await caller.until("session.updated")
            for question in questions:
                after = len(caller.events)
                caller.send(text_turn(question))
                caller.send({"type": "response.create"})
                done = await caller.until("response.done", after=after)
                await caller.until("output_audio_buffer.stopped", after=after, timeout_s=60)
                transcripts.append(transcript_of(done))
                audio.append(np.concatenate(pushed.pop(done["response"]["id"])))
        return transcripts, audio

    async def over_a_socket() -> tuple[list[str], list[np.ndarray]]:
        transcripts, audio = [], []
        client = await Client.open(base.replace("http://", "ws://") + "/v1/realtime",
                                   headers={"Authorization": f"Bearer {API_KEY}"}, extensions=False)
        try:
            await client.send({"type": "session.update", "session": SESSION})
            await client.until("session.updated")
            for question in questions:
                await client.send(text_turn(question))
                await client.send({"type": "response.create"})
                events = await client.until("response.done")
                pcm = b"".join(base64.b64decode(e["delta"]) for e in events
                               if e["type"] == "response.output_audio.delta")
                resampler = StreamingResampler(24000, TRACK_RATE)
                samples = pcm16_to_float(pcm)
                transcripts.append(transcript_of(events[-1]))
                audio.append(float_to_pcm16(np.concatenate([resampler.process(samples), resampler.flush()])))
        finally:
            await client.close()
        return transcripts, audio

    called, heard_over_call = asyncio.run(over_the_call())
    socket, heard_over_socket = asyncio.run(over_a_socket())
    assert called == socket and all(called)
    for on_call, on_socket in zip(heard_over_call, heard_over_socket, strict=True):
        assert on_call.size == on_socket.size > TRACK_RATE // 2
        assert int(np.abs(on_call.astype(np.int32) - on_socket).max()) <= 1


def text_turn(text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def transcript_of(done: dict[str, Any]) -> str:
    return "".join(part.get("transcript", "") for item in done["response"]["output"]
                   for part in item.get("content", []))


@pytest.mark.parametrize("body, content_type, param", [
    ("v=0\r\nthis is no sdp\r\n", "application/sdp", "sdp"),
    ("", "application/sdp", "sdp"),
])
def test_a_bad_offer_is_refused_naming_the_sdp(server, body: str, content_type: str, param: str) -> None:
    base, _ = server
    answered = httpx.post(f"{base}/v1/realtime/calls", content=body,
                          headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": content_type})
    assert answered.status_code == 400
    assert answered.json()["error"]["param"] == param
    asyncio.run(until_no_session(base))


def test_a_bad_session_object_is_refused_naming_it(server) -> None:
    base, _ = server

    async def scenario():
        caller = Caller()
        offer = await caller.offer()
        async with httpx.AsyncClient() as http:
            answered = await http.post(f"{base}/v1/realtime/calls", files={"sdp": (None, offer),
                                                                           "session": (None, "[1, 2]")},
                                       headers={"Authorization": f"Bearer {API_KEY}"})
        await caller.close()
        assert answered.status_code == 400 and answered.json()["error"]["param"] == "session"
        await until_no_session(base)

    asyncio.run(scenario())


def test_a_call_without_the_key_is_unauthorized(server) -> None:
    base, _ = server
    answered = httpx.post(f"{base}/v1/realtime/calls", content="v=0\r\n", headers={"Content-Type": "application/sdp"})
    assert answered.status_code == 401


def test_a_peer_that_never_connects_or_hangs_up_frees_its_slot(server) -> None:
    base, _ = server

    async def scenario():
        caller = Caller()
        offer = await caller.offer()
        async with httpx.AsyncClient() as http:
            answered = await http.post(f"{base}/v1/realtime/calls", content=offer,
                                       headers={"Authorization": f"Bearer {API_KEY}",
                                                "Content-Type": "application/sdp"})
        assert answered.status_code == 201
        await caller.close()  # never applies the answer: no connection
        assert await active_sessions(base) == 1
        await until_no_session(base, timeout_s=10)  # webrtc_connect_timeout_s is 2 s here

        async with call(base) as caller:  # a connected peer that leaves
            await caller.until("session.updated")
        await until_no_session(base)

    asyncio.run(scenario())


def test_a_duplex_mode_deploy_refuses_calls_saying_why(tiny_loaded) -> None:
    """Calls are GA sessions; a `session_mode: duplex` deploy serves the duplex lane only (its
    /v1/realtime too), so a call there is refused (400) with the reason, and no slot is held."""
    with running_server(tiny_loaded, {"session_mode": "duplex"}, session_mode="duplex") as (url, _, _):
        base = url.replace("ws://", "http://")

        async def scenario():
            caller = Caller()
            offer = await caller.offer()
            await caller.close()
            async with httpx.AsyncClient() as http:
                return await http.post(f"{base}/v1/realtime/calls", content=offer,
                                       headers={"Content-Type": "application/sdp"})

        answered = asyncio.run(scenario())
        assert answered.status_code == 400
        assert "duplex lane" in answered.json()["error"]["message"]
        asyncio.run(until_no_session(base))
