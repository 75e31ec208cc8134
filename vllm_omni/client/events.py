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
    """`video_frames`: bare base64 images bound to this append (docs/realtime-api.md §13.6);
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
