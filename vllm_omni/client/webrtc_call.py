"""A realtime session over a WebRTC call (`POST /v1/realtime/calls`, docs/realtime-api.md §15),
driven like a voice client: each question is spoken into the call's microphone track (server
VAD ends the turn) and the answer is heard on the server's track. A turn is timed where the
listener is: TTFP at the first audible frame the track delivers, and a stall wherever the
answer's audible frames pause: the server's track ran dry and played silence."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from vllm_omni.audio.pcm import float_to_pcm16, pcm16_to_float, resample
from vllm_omni.audio.rtc_tracks import TRACK_RATE, SpeakerTrack, pump_microphone
from vllm_omni.client.collector import collect
from vllm_omni.client.playback import playback_metrics
from vllm_omni.client.session_setup import ga_session_update
from vllm_omni.client.timing import TEXT_DELTAS
from vllm_omni.client.turns import SessionResult, TurnResult
from vllm_omni.protocol.server_event_types import (
    ERROR,
    OUTPUT_AUDIO_BUFFER_CLEARED,
    OUTPUT_AUDIO_BUFFER_STARTED,
    OUTPUT_AUDIO_BUFFER_STOPPED,
    RESPONSE_CREATED,
    RESPONSE_DONE,
    SESSION_UPDATED,
)

AUDIBLE = 1e-4  # a frame with a sample louder than this (about 3 LSB) carries sound
FRAME_MS = 20.0  # what one received frame holds (Opus frames of 20 ms)
TAIL_S = 0.3  # frames still on their way when the server says an answer's playback ended
HANGUP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class HeardFrame:
    at: float  # arrival, time.monotonic()
    audible: bool


class CallPeer:
    """One call from the client's side: a microphone track that plays what it is given (and
    silence between), the data channel's events (each stamped `_t` on arrival, as
    client/connection.py stamps a socket's), and the frames heard on the server's track."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.microphone = SpeakerTrack(on_started=lambda _: None, on_stopped=lambda _: None)
        self.pc.addTrack(self.microphone)
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[dict[str, Any]] = []
        self.heard: list[HeardFrame] = []
        self.location: str | None = None
        self._arrived = asyncio.Event()
        self.channel.on("message", self._on_message)
        self.pc.on("track", lambda track: asyncio.ensure_future(pump_microphone(track, self._on_audio)))

    @classmethod
    async def open(cls, calls_url: str, session: dict[str, Any], headers: dict[str, str] | None = None,
                   timeout_s: float = 30.0) -> CallPeer:
        """Post the offer (a form with `sdp` and the GA `session` object) and apply the answer."""
        peer = cls()
        try:
            form = {"sdp": (None, await peer.offer()), "session": (None, json.dumps(session))}
            async with httpx.AsyncClient(timeout=timeout_s) as http:
                answer = await http.post(calls_url, files=form, headers=headers)
            if answer.status_code != 201:
                raise ConnectionError(f"the call was refused ({answer.status_code}): {answer.text[:500]}")
            peer.location = answer.headers.get("location")
            await peer.accept(answer.text)
        except BaseException:
            await peer.pc.close()
            raise
        return peer

    async def offer(self) -> str:
        """The SDP offer, with every host candidate in it (the server does no trickle ICE)."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def accept(self, answer_sdp: str) -> None:
        """Apply the server's SDP answer: the call connects."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer_sdp, type="answer"))

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        event["_t"] = time.monotonic()
        self.events.append(event)
        self._arrived.set()

    async def _on_audio(self, samples: np.ndarray, rate: int) -> None:
        self.heard.append(HeardFrame(time.monotonic(), bool(samples.size and np.abs(samples).max() > AUDIBLE)))

    def speak(self, pcm: bytes, rate: int = 16000) -> None:
        """Say `pcm` (16-bit mono at `rate`) into the microphone, after what it is still saying."""
        samples = resample(pcm16_to_float(pcm), rate, TRACK_RATE)
        self.microphone.push("speech", "speech", float_to_pcm16(samples))

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def until(self, kinds: str | Sequence[str], after: int = 0, timeout_s: float = 60.0,
                    response_id: str | None = None) -> dict[str, Any]:
        """The first event of one of `kinds` from index `after` on (of `response_id`, if given)."""
        wanted = {kinds} if isinstance(kinds, str) else set(kinds)
        async with asyncio.timeout(timeout_s):
            while True:
                for event in self.events[after:]:
                    if event["type"] in wanted and response_id in (None, _response_id(event)):
                        return event
                self._arrived.clear()
                await self._arrived.wait()

    async def close(self) -> None:
        self.microphone.stop()
        await self.pc.close()


def _response_id(event: dict[str, Any]) -> str | None:
    return event.get("response_id") or (event.get("response") or {}).get("id")


def heard_metrics(events: Sequence[dict[str, Any]], heard: Sequence[HeardFrame]) -> dict[str, Any]:
    """One answer's figures as its listener has them: `events` are the answer's own (from its
    `response.created` to the end of its playback), `heard` the frames the track delivered.
    TTFT and TTFP count from `response.created`'s arrival, as client/timing.py does under server
    VAD. The audible frames from then to the end of playback are the answer's chunks for
    client/playback.py, so silent frames between them count as stalls. The track plays at real
    time, so the generation's real-time factor cannot be seen here: `rtf` is None."""
    t0 = next((e["_t"] for e in events if e["type"] == RESPONSE_CREATED), None)
    if t0 is None:  # no answer was heard
        return {"ttft_ms": None, "ttfp_ms": None, "audio_duration_ms": 0.0, "rtf": None, "chunk_count": 0,
                **playback_metrics([])}
    ends = [e["_t"] for e in events if e["type"] in (OUTPUT_AUDIO_BUFFER_STOPPED, OUTPUT_AUDIO_BUFFER_CLEARED)]
    end = (ends[0] if ends else events[-1]["_t"]) + TAIL_S
    chunks = [(frame.at * 1000, FRAME_MS) for frame in heard if t0 <= frame.at <= end and frame.audible]
    text = [e["_t"] for e in events if e["type"] in TEXT_DELTAS and e.get("delta")]
    ttfp_ms = (chunks[0][0] - t0 * 1000) if chunks else None
    return {"ttft_ms": (text[0] - t0) * 1000 if text else None, "ttfp_ms": ttfp_ms,
            "audio_duration_ms": FRAME_MS * len(chunks), "rtf": None, "chunk_count": len(chunks),
            **playback_metrics(chunks, ttfp_ms)}


async def run_call_session(calls_url: str, pcm: bytes, *, turns: int = 1, model: str | None = None,
                           headers: dict[str, str] | None = None, answer_timeout_s: float = 300.0,
                           on_turn: Callable[[TurnResult], None] | None = None) -> SessionResult:
    """Speak `pcm` (16 kHz PCM16) into a call `turns` times, each time after the previous
    answer was heard to its end; the server's VAD ends each turn (the silence after the
    speech: the track sends it). `on_turn` is called with each turn's result as it ends."""
    session = ga_session_update(model=model, server_vad=True)["session"]
    peer = await CallPeer.open(calls_url, session, headers)
    result = SessionResult()
    try:
        await peer.until(SESSION_UPDATED, timeout_s=answer_timeout_s)
        for _ in range(turns):
            first = len(peer.events)
            peer.speak(pcm)
            done = await peer.until(RESPONSE_DONE, after=first, timeout_s=answer_timeout_s)
            response_id = done["response"]["id"]
            if any(e["type"] == OUTPUT_AUDIO_BUFFER_STARTED and e["response_id"] == response_id
                   for e in peer.events[first:]) or done["response"]["status"] == "completed":
                await peer.until((OUTPUT_AUDIO_BUFFER_STOPPED, OUTPUT_AUDIO_BUFFER_CLEARED), after=first,
                                 timeout_s=answer_timeout_s, response_id=response_id)
            await asyncio.sleep(TAIL_S)
            record = collect(peer.events[first:]).responses.get(response_id)
            result.turns.append(TurnResult(record, heard_metrics(record.events if record else [], peer.heard)))
            if on_turn is not None:
                on_turn(result.turns[-1])
    finally:
        result.errors = [e for e in peer.events if e["type"] == ERROR]
        await hang_up(peer, calls_url, headers)
    return result


async def hang_up(peer: CallPeer, calls_url: str, headers: dict[str, str] | None) -> None:
    """`POST …/hangup` (the server frees the session at once), then close the peer."""
    if peer.location is not None:
        try:
            async with httpx.AsyncClient(timeout=HANGUP_TIMEOUT_S) as http:
                await http.post(httpx.URL(calls_url).join(peer.location + "/hangup"), headers=headers)
        except httpx.HTTPError:
            pass  # closing the peer ends the call too
    await peer.close()
