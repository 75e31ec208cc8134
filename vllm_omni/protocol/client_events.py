"""Client events (realtime-protocol.md §3) as pydantic models.

Models accept extra keys (clients send fields this server does not use) and coerce
nothing they cannot: a wrong type becomes a `bad_event` naming the field. Fields whose
validation has its own error code (audio, formats, played_ms) stay loosely typed here and
are checked where the code is known.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vllm_omni.protocol.errors import ProtocolError

MAX_EVENT_BYTES = 15 * 1024 * 1024


class ClientEvent(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: str
    event_id: str | None = None


class SessionUpdate(ClientEvent):
    session: dict[str, Any] | None = None
    model: Any = None  # legacy lane: top-level model


class InputAudioBufferAppend(ClientEvent):
    audio: str | None = None
    delta: str | None = None  # alias of audio
    input_audio_format: Any = None
    format: Any = None
    sample_rate_hz: Any = None
    sample_rate: Any = None
    transcript: str | None = None
    video_frames: Any = None

    @property
    def payload(self) -> str | None:
        return self.audio or self.delta or None


class InputAudioBufferCommit(ClientEvent):
    final: Any = None
    create_response: bool | None = None
    response_create: bool | None = None


class ConversationItemCreate(ClientEvent):
    previous_item_id: str | None = None
    item: dict[str, Any] | None = None


class ItemReference(ClientEvent):
    item_id: str | None = None


class ConversationItemTruncate(ItemReference):
    content_index: int = 0
    audio_end_ms: Any = None


class ResponseCreate(ClientEvent):
    response: dict[str, Any] = Field(default_factory=dict)


class ResponseReference(ClientEvent):
    response_id: str | None = None


class PlaybackAck(ResponseReference):
    item_id: str | None = None
    played_ms: Any = None
    committed_ms: Any = None
    truncate: bool = False


class SessionClose(ClientEvent):
    reason: str | None = None


class InputTextAppend(ClientEvent):
    text: Any = None


EVENT_MODELS: dict[str, type[ClientEvent]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": InputAudioBufferAppend,
    "input_audio_buffer.commit": InputAudioBufferCommit,
    "input.commit": InputAudioBufferCommit,
    "input_audio_buffer.clear": ClientEvent,
    "conversation.item.create": ConversationItemCreate,
    "conversation.item.delete": ItemReference,
    "conversation.item.retrieve": ItemReference,
    "conversation.item.truncate": ConversationItemTruncate,
    "response.create": ResponseCreate,
    "response.cancel": ResponseReference,
    "output_audio_buffer.clear": ResponseReference,
    "playback.ack": PlaybackAck,
    "audio.playback_ack": PlaybackAck,
    "session.close": SessionClose,
    "close": SessionClose,
    "close_session": SessionClose,
    "session.heartbeat": ClientEvent,
    "input.cancel": ClientEvent,
    "barge_in": ClientEvent,
    "input.text.append": InputTextAppend,
    "input_text.append": InputTextAppend,
    "push_text": InputTextAppend,
}


def parse_client_event(raw: dict[str, Any], known: dict[str, type[ClientEvent]] = EVENT_MODELS) -> ClientEvent:
    """Validate one decoded JSON object; raises ProtocolError (bad_event / unknown_event)."""
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("bad_event", "event must be an object with a string 'type'", "type")
    model = known.get(kind)
    if model is None:
        raise ProtocolError("unknown_event", f"Unknown event type: {kind}", "type")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"])
        raise ProtocolError("bad_event", f"{kind}: {param}: {first['msg']}", param) from None
