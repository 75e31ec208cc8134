"""WebRTC calls (`POST /v1/realtime/calls`, docs/realtime-api.md §15) against a real server on
the tiny Qwen3-Omni deploy, with an aiortc client as a browser would be: an Opus microphone
track playing a fixture's speech, the `oai-events` data channel, the model's speech heard on
the answer's track. Bad offers, a missing key and a peer that never connects or leaves end
cleanly with the session slot freed."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from tests.realtime_helpers import MODEL_NAME, fixture_pcm, running_server
from vllm_omni.audio.pcm import float_to_pcm16, pcm16_to_float, resample
from vllm_omni.server.webrtc_audio import TRACK_RATE, SpeakerTrack, pump_microphone

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


class Caller:
    """An aiortc peer: a microphone that plays what it is given (silence between), the data
    channel's events, and the samples heard on the server's track."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.microphone = SpeakerTrack(on_started=lambda _: None, on_stopped=lambda _: None)
        self.pc.addTrack(self.microphone)
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[dict[str, Any]] = []
        self.heard: list[np.ndarray] = []
        self._arrived = asyncio.Event()
        self.channel.on("message", self._on_message)
        self.pc.on("track", lambda track: asyncio.ensure_future(pump_microphone(track, self._on_audio)))

    def _on_message(self, message: str) -> None:
        self.events.append(json.loads(message))
        self._arrived.set()

    async def _on_audio(self, samples: np.ndarray, rate: int) -> None:
        self.heard.append(samples)

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def event(self, kind: str, timeout_s: float = 60.0, after: int = 0) -> dict[str, Any]:
        """The first `kind` event from index `after` on, waiting for it."""
        async with asyncio.timeout(timeout_s):
            while True:
                for event in self.events[after:]:
                    if event["type"] == kind:
                        return event
                self._arrived.clear()
                await self._arrived.wait()

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def loud_heard(self) -> int:
        """Samples heard louder than silence."""
        return int((np.abs(np.concatenate(self.heard)) > 1e-3).sum()) if self.heard else 0


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
    await caller.pc.setRemoteDescription(RTCSessionDescription(sdp=answered.text, type="answer"))
    try:
        yield caller
    finally:
        await caller.pc.close()


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
            created = await caller.event("session.created")
            assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            updated = await caller.event("session.updated")  # the call's session object, applied
            assert updated["session"]["instructions"] == "Answer briefly."
            caller.microphone.push("question", "question", speech_at_track_rate("speech_en_single.wav"))
            await caller.event("input_audio_buffer.speech_started")
            await caller.event("input_audio_buffer.committed")
            done = await caller.event("response.done")
            started = await caller.event("output_audio_buffer.started")
            stopped = await caller.event("output_audio_buffer.stopped", timeout_s=60)
            assert started["response_id"] == stopped["response_id"] == done["response"]["id"]
            assert done["response"]["status"] == "completed"
            kinds = [event["type"] for event in caller.events]
            assert "response.output_audio.delta" not in kinds  # the audio is on the track
            assert "response.output_audio_transcript.delta" in kinds
            assert [e for e in caller.events if e["type"] == "error"] == []
            assert caller.loud_heard() > TRACK_RATE // 10  # speech heard on the track
        await until_no_session(base)

    asyncio.run(scenario())


def test_speaking_over_the_answer_clears_it_and_truncates_to_what_was_played(server) -> None:
    base, _ = server

    async def scenario():
        async with call(base) as caller:
            await caller.event("session.updated")
            caller.microphone.push("question", "question", speech_at_track_rate("speech_en_single.wav"))
            started = await caller.event("output_audio_buffer.started")
            await asyncio.sleep(0.3)  # some of the answer plays
            after = len(caller.events)
            caller.microphone.push("barge-in", "barge-in", speech_at_track_rate("speech_en_single.wav"))
            cleared = await caller.event("output_audio_buffer.cleared", after=after)
            assert cleared["response_id"] == started["response_id"]
            truncated = await caller.event("conversation.item.truncated", after=after)
            assert 0 < truncated["audio_end_ms"] < 10_000
            await caller.event("response.done", after=len(caller.events))  # the barge-in's own answer
            assert [e for e in caller.events if e["type"] == "error"] == []
        await until_no_session(base)

    asyncio.run(scenario())


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
        await caller.pc.close()
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
        await caller.pc.close()  # never applies the answer: no connection
        assert await active_sessions(base) == 1
        await until_no_session(base, timeout_s=10)  # webrtc_connect_timeout_s is 2 s here

        async with call(base) as caller:  # a connected peer that leaves
            await caller.event("session.updated")
        await until_no_session(base)

    asyncio.run(scenario())
