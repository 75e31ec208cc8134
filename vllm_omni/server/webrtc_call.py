"""`POST /v1/realtime/calls`: OpenAI's GA WebRTC interface (docs/realtime-api.md §15).

The caller posts an SDP offer (raw `application/sdp`, or a form with `sdp` and the `session`
object as OpenAI accepts it) and gets the SDP answer. The call is one GA session, the same as
a `/v1/realtime` socket's, with three differences that belong to the transport only:

- the client and server events travel on the data channel the caller opened (`oai-events`),
  except the audio: the caller's microphone track is fed to the session as
  `input_audio_buffer.append` events, and the model's audio deltas go to the outgoing speaker
  track (audio/rtc_tracks.py) instead of the channel;
- the speaker reports `output_audio_buffer.started` / `stopped` as the audio actually plays,
  and `output_audio_buffer.clear` or a barge-in (speech started while it plays) drops what has
  not played (`output_audio_buffer.cleared`) and truncates the item to what was played;
- the call ends when the peer connection fails or closes, when it does not connect within
  `webrtc_connect_timeout_s`, at the session's maximum duration, or on `POST .../hangup`; its slot is
  freed then.

ICE uses host candidates only (no STUN or TURN servers).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from vllm_omni.audio.formats import OutputEncoder, bytes_to_float
from vllm_omni.audio.pcm import StreamingResampler, float_to_pcm16, float_to_pcm16_bytes
from vllm_omni.audio.rtc_tracks import TRACK_RATE, SpeakerTrack, pump_microphone
from vllm_omni.protocol import server_event_types as kinds
from vllm_omni.protocol.chat_completions import error_body
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import (
    output_audio_buffer_cleared,
    output_audio_buffer_started,
    output_audio_buffer_stopped,
)
from vllm_omni.protocol.server_events import error_event, new_id
from vllm_omni.protocol.wire_text import wire_text
from vllm_omni.server.settings import ServerSettings
from vllm_omni.server.slots import SessionSlots
from vllm_omni.session.factory import SessionFactory, SessionRefused
from vllm_omni.session.session import Session

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # for the session's work to stop
APPEND_MS = 40  # microphone audio per append event
MAX_OFFER_BYTES = 64 * 1024


class RealtimeCall:
    """One WebRTC call: its peer connection, its GA session and the tasks between them."""

    def __init__(self, factory: SessionFactory, settings: ServerSettings, model: str, release_slot: Callable[[], None]):
        self.id = new_id("rtc_")
        self.settings = settings
        self._release_slot = release_slot
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._pending_text: list[str] = []  # events before the data channel opened
        self._channel: Any = None
        self._tasks: set[asyncio.Task] = set()
        self._ended = asyncio.Event()
        self._connected = asyncio.Event()
        self._mic_resampler: StreamingResampler | None = None
        self._mic_encoder: OutputEncoder | None = None
        self._mic_pending: list[np.ndarray] = []
        self._speaker_resamplers: dict[str, tuple[str, StreamingResampler]] = {}  # per response: its item
        self._cut: set[str] = set()  # responses whose playback was cleared: their late audio is dropped
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.speaker = SpeakerTrack(
            on_started=lambda response_id: self._send(output_audio_buffer_started(response_id=response_id)),
            on_stopped=lambda response_id: self._send(output_audio_buffer_stopped(response_id=response_id)))
        self.session: Session = factory.open_ga(model, self._on_session_event)

    async def answer(self, offer_sdp: str, session_object: dict[str, Any] | None) -> str:
        """Take the offer; return the SDP answer (ProtocolError naming `sdp` if the offer is unusable)."""
        pc = self.pc
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as bad:  # aiortc raises ValueError and others for what it cannot parse
            raise ProtocolError("invalid_sdp", f"the SDP offer could not be used: {bad}", "sdp") from None
        if not any(t.kind == "audio" for t in pc.getTransceivers()):
            raise ProtocolError("invalid_sdp", "the SDP offer has no audio media section", "sdp")
        pc.addTrack(self.speaker)
        await pc.setLocalDescription(await pc.createAnswer())
        if session_object is not None:
            self._inbox.put_nowait({"type": "session.update", "session": session_object})
        self._spawn(self._run())
        return pc.localDescription.sdp

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # The peer connection's events --------------------------------------------------------

    def _on_track(self, track: Any) -> None:
        if track.kind == "audio":
            self._spawn(pump_microphone(track, self._on_microphone))

    def _on_datachannel(self, channel: Any) -> None:
        self._channel = channel
        channel.on("message", self._on_channel_message)
        for text in self._pending_text:
            channel.send(text)
        self._pending_text.clear()

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self._connected.set()
        elif state in ("failed", "closed"):
            self._ended.set()

    def _on_channel_message(self, message: str | bytes) -> None:
        try:
            raw = json.loads(message)
            if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
                raise ValueError("an event is a JSON object with a string `type`")
        except ValueError as bad:
            self.session.report(ProtocolError("invalid_json", f"the data channel message is no event: {bad}"))
            return
        self._inbox.put_nowait(raw)

    # Audio in and out ---------------------------------------------------------------------

    async def _on_microphone(self, samples: np.ndarray, rate: int) -> None:
        """The caller's audio as appends in the session's input format, APPEND_MS at a time."""
        fmt = self.session.config.input_format
        if fmt.name == "pcm16":
            if self._mic_resampler is None or self._mic_resampler.source_rate != rate:
                self._mic_resampler = StreamingResampler(rate, fmt.rate)
            self._mic_pending.append(self._mic_resampler.process(samples))
            pending = sum(chunk.size for chunk in self._mic_pending)
            if pending * 1000 < APPEND_MS * fmt.rate:
                return
            data = float_to_pcm16_bytes(np.concatenate(self._mic_pending))
        else:  # G.711: the session's encoder resamples from the track's rate
            if self._mic_encoder is None or self._mic_encoder.fmt != fmt:
                self._mic_encoder = OutputEncoder(fmt)
            data, _ = self._mic_encoder.encode(float_to_pcm16_bytes(samples), rate)
        self._mic_pending.clear()
        self._inbox.put_nowait({"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode()})

    def _play(self, event: dict[str, Any]) -> None:
        fmt = self.session.config.output_format
        samples = bytes_to_float(base64.b64decode(event["delta"]), fmt)
        response_id, item_id = event["response_id"], event["item_id"]
        if response_id in self._cut:
            return
        if response_id not in self._speaker_resamplers:
            self._speaker_resamplers[response_id] = item_id, StreamingResampler(fmt.rate, TRACK_RATE)
        resampler = self._speaker_resamplers[response_id][1]
        self.speaker.push(response_id, item_id, float_to_pcm16(resampler.process(samples)))

    def _response_done(self, response_id: str) -> None:
        """The response's audio is complete: the resampler's tail follows it to the speaker."""
        if response_id in self._speaker_resamplers:
            item_id, resampler = self._speaker_resamplers.pop(response_id)
            self.speaker.push(response_id, item_id, float_to_pcm16(resampler.flush()))
        self.speaker.finish(response_id)

    def _clear_speaker(self) -> str | None:
        """Drop the speaker's unplayed audio and whatever more of that response comes."""
        response_id = self.speaker.clear()
        if response_id is not None:
            self._cut.add(response_id)
            self._speaker_resamplers.pop(response_id, None)
        return response_id

    def _cut_playback(self) -> None:
        """A barge-in: the unplayed audio goes, and the item is truncated to what was heard."""
        item_id = self.speaker.current_item
        response_id = self._clear_speaker()
        if response_id is None:
            return
        self._send(output_audio_buffer_cleared(response_id=response_id))
        if item_id:
            self._inbox.put_nowait({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                                    "audio_end_ms": int(self.speaker.played_ms.get(item_id, 0))})

    # Session events out -------------------------------------------------------------------

    def _on_session_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == kinds.OUTPUT_AUDIO_DELTA:
            self._play(event)
            return
        if kind == kinds.RESPONSE_DONE:
            self._response_done(event["response"]["id"])
        elif kind == kinds.OUTPUT_AUDIO_BUFFER_CLEARED:
            return  # the speaker is the authority on what it cleared (_handle)
        elif kind == kinds.SPEECH_STARTED and self.speaker.playing is not None:
            self._cut_playback()
        self._send(event)

    def _send(self, event: dict[str, Any]) -> None:
        text = wire_text(event)
        if self._channel is None:
            self._pending_text.append(text)
        elif self._channel.readyState == "open":
            self._channel.send(text)

    # The call's life ----------------------------------------------------------------------

    async def _run(self) -> None:
        started = time.monotonic()
        ending = asyncio.ensure_future(self._ended.wait())
        try:
            connected = asyncio.ensure_future(self._connected.wait())
            done, _ = await asyncio.wait({connected, ending}, timeout=self.settings.webrtc_connect_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            connected.cancel()
            if not done:
                logger.info("WebRTC call %s: no connection within %.0f s", self.id,
                            self.settings.webrtc_connect_timeout_s)
                return
            while not self._ended.is_set():
                remaining = self.settings.max_session_duration_s - (time.monotonic() - started)
                if remaining <= 0:
                    return
                taking = asyncio.ensure_future(self._inbox.get())
                done, _ = await asyncio.wait({taking, ending}, timeout=remaining,
                                             return_when=asyncio.FIRST_COMPLETED)
                if taking not in done:
                    taking.cancel()
                    return
                await self._handle(taking.result())
        except Exception:
            logger.exception("WebRTC call %s failed", self.id)
        finally:
            ending.cancel()
            await self.close()

    async def _handle(self, raw: dict[str, Any]) -> None:
        if raw["type"] == "output_audio_buffer.clear":  # the session stops the response; the speaker says cleared
            response_id = self._clear_speaker()
            if response_id is not None:
                self._send(output_audio_buffer_cleared(response_id=response_id))
        try:
            await self.session.handle(raw)
        except ProtocolError as problem:
            self._send(error_event(problem))

    async def wait_ended(self) -> None:
        await self._ended.wait()

    async def close(self) -> None:
        """End the call (idempotent): the session's work stops, the slot frees, the peer closes."""
        if self._release_slot is None:
            return
        release, self._release_slot = self._release_slot, None
        self._ended.set()
        try:
            await asyncio.wait_for(self.session.close(), STOP_TIMEOUT_S)
        except Exception:
            logger.exception("stopping WebRTC call %s's session failed", self.id)
        release()
        self.speaker.stop()
        await self.pc.close()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()


async def read_offer(request: Request) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and the optional session object of a call request (ProtocolError naming
    the field that is wrong)."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data") or content_type.startswith("application/x-www-form-urlencoded"):
        form = await request.form()
        sdp, session = form.get("sdp"), form.get("session")
        if not isinstance(sdp, str) or not sdp.strip():
            raise ProtocolError("invalid_request_error", "the form has no `sdp` field with the SDP offer", "sdp")
        session_object = None
        if session is not None:
            try:
                session_object = json.loads(session)
            except (TypeError, ValueError):
                raise ProtocolError("invalid_request_error", "`session` is not a JSON object", "session") from None
            if not isinstance(session_object, dict):
                raise ProtocolError("invalid_request_error", "`session` is not a JSON object", "session")
        return sdp, session_object
    body = await request.body()
    if len(body) > MAX_OFFER_BYTES:
        raise ProtocolError("invalid_request_error", f"the SDP offer is larger than {MAX_OFFER_BYTES} bytes", "sdp")
    if not body.strip():
        raise ProtocolError("invalid_request_error", "the body holds no SDP offer (send application/sdp, or a "
                            "form with `sdp` and `session`)", "sdp")
    return body.decode(errors="replace"), None


def _error(problem: ProtocolError, status: int) -> JSONResponse:
    return JSONResponse(error_body(problem), status_code=status)


class OpenCalls(dict[str, RealtimeCall]):
    """The server's calls by id; at shutdown each is ended (its peer closed, its slot freed)."""

    async def close_all(self) -> None:
        await asyncio.gather(*(call.close() for call in list(self.values())), return_exceptions=True)


def webrtc_router(factory: SessionFactory, settings: ServerSettings, slots: SessionSlots,
                  calls: OpenCalls) -> APIRouter:
    """The call routes; the API key is checked by the app's middleware, as on every route."""
    router = APIRouter()

    @router.post("/v1/realtime/calls")
    async def create_call(request: Request) -> Response:
        try:
            offer, session_object = await read_offer(request)
        except ProtocolError as problem:
            return _error(problem, 400)
        model = (session_object or {}).get("model") or request.query_params.get("model") \
            or settings.served_model_names[0]
        if model not in settings.served_model_names:
            return _error(ProtocolError("model_not_found", f"The model `{str(model)[:200]}` does not exist.",
                                        "model"), 404)
        release = slots.take()
        if release is None:
            return _error(ProtocolError("resource_exhausted",
                                        f"session_capacity_exhausted: limit={settings.max_sessions}"), 429)
        try:
            call = RealtimeCall(factory, settings, model, release)
        except SessionRefused as refused:
            release()
            return _error(ProtocolError(refused.code, refused.message), 400)
        try:
            answer = await call.answer(offer, session_object)
        except ProtocolError as problem:
            await call.close()
            return _error(problem, 400)
        calls[call.id] = call
        asyncio.ensure_future(_forget_when_closed(calls, call))
        return Response(answer, status_code=201, media_type="application/sdp",
                        headers={"Location": f"/v1/realtime/calls/{call.id}"})

    @router.post("/v1/realtime/calls/{call_id}/hangup")
    async def hangup(call_id: str) -> Response:
        call = calls.get(call_id)
        if call is None:
            return _error(ProtocolError("call_not_found", f"no call {call_id[:100]}", "call_id"), 404)
        await call.close()
        return Response(status_code=200)

    return router


async def _forget_when_closed(calls: dict[str, RealtimeCall], call: RealtimeCall) -> None:
    await call.wait_ended()
    calls.pop(call.id, None)
