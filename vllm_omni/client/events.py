"""The client events this library sends, built from the protocol's models: the client and the
server share one definition (and the strict checks) of each event."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from vllm_omni.protocol import client_events as ce


def wire(model: ce.WireModel) -> dict[str, Any]:
    """The fields that were given and only those: an explicit None stays on the wire (a null
    `turn_detection` turns server VAD off), an omitted field stays off it."""
    return model.model_dump(exclude_unset=True)


def session_update(session: ce.SessionSettings) -> dict[str, Any]:
    return wire(ce.SessionUpdate(type="session.update", session=wire(session)))


def input_audio_append(pcm: bytes, video_frames: Sequence[str] | None = None,
                       sample_rate_hz: int | None = None) -> dict[str, Any]:
    """`video_frames`: bare base64 images bound to this append (docs/realtime-api.md §13.8);
    `sample_rate_hz`: the PCM's rate, if not the session's."""
    extra: dict[str, Any] = {} if video_frames is None else {"video_frames": list(video_frames)}
    if sample_rate_hz is not None:
        extra["sample_rate_hz"] = sample_rate_hz
    return wire(ce.InputAudioBufferAppend(type="input_audio_buffer.append", audio=base64.b64encode(pcm).decode(),
                                          **extra))


def input_audio_commit() -> dict[str, Any]:
    return wire(ce.InputAudioBufferCommit(type="input_audio_buffer.commit"))


def response_create() -> dict[str, Any]:
    return wire(ce.ResponseCreate(type="response.create"))


def playback_ack(response_id: str, played_ms: int) -> dict[str, Any]:
    """All of the response's audio up to `played_ms` was played, and is kept in the history."""
    return wire(ce.PlaybackAck(type="playback.ack", response_id=response_id, item_id=f"item_{response_id}",
                               played_ms=played_ms, committed_ms=played_ms))


def session_close() -> dict[str, Any]:
    return wire(ce.SessionClose(type="session.close"))


def image_message(image_url: str) -> dict[str, Any]:
    """A user message holding one image (`image_url`: a data URL), docs/realtime-api.md §4.5."""
    part = ce.ImagePart(type="input_image", image_url=image_url)
    return wire(ce.ConversationItemCreate(type="conversation.item.create",
                                          item=ce.ItemPayload(type="message", role="user", content=[part])))


# Duplex lane session control (docs/realtime-api.md §13.4). The protocol has no models for
# these: the GA lane refuses them (§4.1), the duplex connection handles them before any session.

def event_ack(server_event_seq: int) -> dict[str, Any]:
    return wire(ce.ClientEvent(type="session.event_ack", server_event_seq=server_event_seq))


def session_resume(session_id: str, resume_token: str, last_received_server_event_seq: int) -> dict[str, Any]:
    return wire(ce.ClientEvent(type="session.resume", session_id=session_id, resume_token=resume_token,
                               last_received_server_event_seq=last_received_server_event_seq))
