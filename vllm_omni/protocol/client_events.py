"""Client events as strict pydantic models.

Every field the protocol defines is declared with its type and bounds, and nothing is
coerced: a wrong type or an out-of-range value is a `bad_event` naming the field, never a
silently ignored value or an exception further in. Keys the protocol does not define are
allowed (clients send fields this server does not use). Fields whose checks have an error
code of their own (audio formats, turn detection, voices) are declared loosely here and
checked where that code is known.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError
from pydantic_core import ErrorDetails

from vllm_omni.protocol.errors import ProtocolError

MAX_ID_CHARS = 512  # event, item and response ids
MAX_REASON_CHARS = 256  # session.close reasons (a close frame carries at most 123 bytes of it)
MAX_OUTPUT_TOKENS = 1_000_000

Id = Annotated[str, Field(max_length=MAX_ID_CHARS)]
Milliseconds = Annotated[float, Field(ge=0)]
Probability = Annotated[float, Field(ge=0, le=1)]
Rate = Annotated[int, Field(ge=8000, le=192000)]
Speed = Annotated[float, Field(ge=0.25, le=4.0)]
Temperature = Annotated[float, Field(ge=0, le=2)]
TokenLimit = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS)] | Literal["inf", "infinity", "unlimited"]
ToolChoice = Literal["auto", "none", "required"] | dict[str, Any]
# GA metadata: at most 16 pairs of strings, keys up to 64 characters, values up to 512
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                     Field(max_length=16)]
FormatSpec = str | dict[str, Any]  # checked by session_config.parse_format (unsupported_audio_format)


class WireModel(BaseModel):
    """Strict types, finite numbers, unknown keys allowed."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False, populate_by_name=True)


class ClientEvent(WireModel):
    type: str
    event_id: Id | None = None


# session.update ---------------------------------------------------------------------------

class AudioInputSettings(WireModel):
    format: Any = None  # parse_format
    sample_rate_hz: Rate | None = None
    sample_rate: Rate | None = None
    turn_detection: Any = None  # parse_turn_detection
    transcription: dict[str, Any] | None = None
    noise_reduction: dict[str, Any] | None = None


class AudioOutputSettings(WireModel):
    format: Any = None  # parse_format
    sample_rate_hz: Rate | None = None
    sample_rate: Rate | None = None
    voice: Any = None  # voice objects have their own message
    speed: Speed | None = None


class AudioSettings(WireModel):
    input: AudioInputSettings | None = None
    output: AudioOutputSettings | None = None


class GenerationSettings(WireModel):
    """What a session sets for every response and a response.create may override."""

    speed: Speed | None = None
    max_output_tokens: TokenLimit | None = None
    max_response_output_tokens: TokenLimit | None = None
    max_tokens: TokenLimit | None = None
    temperature: Temperature | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    metadata: Metadata | None = None
    prompt: dict[str, Any] | None = None


class SessionSettings(GenerationSettings):
    """The `session` object of a session.update, GA nested and flat spellings alike."""

    type: Literal["realtime", "transcription"] | None = None
    model: Id | None = None
    id: Id | None = None
    session_id: Id | None = None
    object: str | None = None
    instructions: str | None = None
    modalities: Any = None  # checked with its own message
    output_modalities: Any = None
    audio: AudioSettings | None = None
    input_audio_format: Any = None
    output_audio_format: Any = None
    response_format: Any = None
    sample_rate_hz: Rate | None = None
    sample_rate: Rate | None = None
    turn_detection: Any = None
    input_audio_transcription: dict[str, Any] | None = None
    input_audio_noise_reduction: dict[str, Any] | None = None
    voice: Any = None
    include: list[str] | None = None
    tracing: str | dict[str, Any] | None = None
    truncation: str | dict[str, Any] | None = None
    idle_timeout_s: Annotated[float, Field(gt=0, le=86400)] | None = None
    overlap_policy: str | None = None
    overlap_short_ack_ms: Milliseconds | None = None
    overlap_barge_in_ms: Milliseconds | None = None
    overlap_silence_rms: Annotated[float, Field(ge=0)] | None = None
    playback_commit_policy: str | None = None
    extra_body: dict[str, Any] | None = None
    ref_audio: str | None = None
    initial_user_text: str | None = None


class SessionUpdate(ClientEvent):
    session: dict[str, Any] | None = None  # validated as SessionSettings when applied
    model: Any = None  # legacy lane: top-level model


# Input audio --------------------------------------------------------------------------------

class VadHint(WireModel):
    is_speech: bool | None = None
    speech_probability: Probability | None = None
    probability: Probability | None = None
    silence_rms: Annotated[float, Field(ge=0)] | None = None


class InputAudioBufferAppend(ClientEvent):
    audio: str | None = None
    delta: str | None = None  # alias of audio
    input_audio_format: FormatSpec | None = None
    format: FormatSpec | None = None
    sample_rate_hz: int | None = None  # range checked with its own message
    sample_rate: int | None = None
    duration_ms: Milliseconds | None = None
    audio_duration_ms: Milliseconds | None = None
    audio_start_ms: Milliseconds | None = None
    audio_end_ms: Milliseconds | None = None
    is_speech: bool | None = None
    speech: bool | None = None
    speech_probability: Probability | None = None
    vad: VadHint | None = None
    overlap_silence_rms: Annotated[float, Field(ge=0)] | None = None
    video_frames: Any = None  # checked by images.frames_from_append (invalid_video_frames)
    max_slice_nums: Any = None  # likewise
    overlap_action: str | None = None
    overlap: str | None = None
    force_barge_in: bool | None = None
    force_listen: bool | None = None
    transcript: str | None = None
    text: str | None = None

    @property
    def payload(self) -> str | None:
        return self.audio or self.delta or None


class InputAudioBufferCommit(ClientEvent):
    final: bool | None = None
    create_response: bool | None = None
    response_create: bool | None = None
    is_speech: bool | None = None


# Conversation items -------------------------------------------------------------------------

class TextPart(WireModel):
    type: Literal["input_text", "output_text", "text"]
    text: str = ""


class AudioPart(WireModel):
    type: Literal["input_audio", "audio", "output_audio"]
    audio: str | None = None
    data: str | None = None  # alias of audio
    format: FormatSpec | None = None
    sample_rate_hz: int | None = None
    transcript: str | None = None


class ImagePart(WireModel):
    type: Literal["input_image"]
    image_url: str | None = None
    detail: str | None = None


_UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|constrained-\w+|\w+\[.*\])$", re.IGNORECASE)
PART_TAGS = ("input_text", "output_text", "text", "input_audio", "audio", "output_audio", "input_image")
INPUT_TAGS = ("item", "item_reference")  # the members of a response.create input entry
ContentPart = Annotated[TextPart | AudioPart | ImagePart, Field(discriminator="type")]


class ItemPayload(WireModel):
    id: Id | None = None
    object: str | None = None
    type: Literal["message", "function_call", "function_call_output"] = "message"
    role: Literal["user", "assistant", "system"] = "user"
    status: str | None = None
    content: list[ContentPart] = Field(default_factory=list)
    call_id: Id | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class InputItemReference(WireModel):
    """An existing conversation item named in a response.create `input`."""

    type: Literal["item_reference"]
    id: Id


def _input_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "item_reference" if kind == "item_reference" else "item"


InputEntry = Annotated[Annotated[InputItemReference, Tag("item_reference")] | Annotated[ItemPayload, Tag("item")],
                       Discriminator(_input_kind)]


class ConversationItemCreate(ClientEvent):
    previous_item_id: Id | None = None
    item: ItemPayload | None = None


class ItemReference(ClientEvent):
    item_id: Id | None = None


class ConversationItemTruncate(ItemReference):
    content_index: Annotated[int, Field(ge=0)] = 0
    audio_end_ms: Milliseconds | None = None


# Responses ----------------------------------------------------------------------------------

class ResponseAudioSettings(WireModel):
    output: AudioOutputSettings | None = None


class ResponseSettings(GenerationSettings):
    """Per-response overrides of response.create."""

    output_modalities: list[str] | None = None
    modalities: list[str] | None = None
    instructions: str | None = None
    voice: str | None = None
    audio: ResponseAudioSettings | None = None
    output_audio_format: FormatSpec | None = None
    response_format: FormatSpec | None = None
    conversation: Literal["auto", "none"] | None = None
    input: list[InputEntry] | None = None  # the response's context instead of the conversation
    extra_body: dict[str, Any] | None = None


class ResponseCreate(ClientEvent):
    response: ResponseSettings = Field(default_factory=ResponseSettings)


class ResponseReference(ClientEvent):
    response_id: Id | None = None


class PlaybackAck(ResponseReference):
    item_id: Id | None = None
    played_ms: float | None = None  # negative counts as 0
    committed_ms: float | None = None
    truncate: bool = False


# Session control ----------------------------------------------------------------------------

class SessionClose(ClientEvent):
    reason: Annotated[str, Field(max_length=MAX_REASON_CHARS)] | None = None


class InputTextAppend(ClientEvent):
    text: str | None = None


class TurnSignal(ClientEvent):
    """A client's turn-taking signal (duplex lane): a command's name and body, or a state change."""

    event: Annotated[str, Field(max_length=MAX_ID_CHARS)] | None = None
    payload: dict[str, Any] | None = None


EVENT_MODELS: dict[str, type[ClientEvent]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": InputAudioBufferAppend,
    "input_audio_buffer.commit": InputAudioBufferCommit,
    "input_audio_buffer.clear": ClientEvent,
    "conversation.item.create": ConversationItemCreate,
    "conversation.item.delete": ItemReference,
    "conversation.item.retrieve": ItemReference,
    "conversation.item.truncate": ConversationItemTruncate,
    "response.create": ResponseCreate,
    "response.cancel": ResponseReference,
    "output_audio_buffer.clear": ResponseReference,
    "playback.ack": PlaybackAck,
    "session.close": SessionClose,
    "session.heartbeat": ClientEvent,
    "input.cancel": ClientEvent,
    "input.text.append": InputTextAppend,
    "turn.signal": TurnSignal,
}

# Other spellings clients send, and the event type each stands for (the one list of them).
# A parsed event keeps the type it was sent with: `input.commit` asks for a response by default.
ALIASES: dict[str, str] = {
    "input.commit": "input_audio_buffer.commit",
    "audio.playback_ack": "playback.ack",
    "close": "session.close",
    "close_session": "session.close",
    "barge_in": "input.cancel",
    "input_text.append": "input.text.append",
    "push_text": "input.text.append",
    "signal_turn": "turn.signal",
}


def canonical_type(kind: str) -> str:
    """The event type `kind` stands for (itself unless it is an alias)."""
    return ALIASES.get(kind, kind)


def client_event_id(raw: dict[str, Any]) -> str | None:
    """The client's `event_id`, when it is one an error may echo."""
    event_id = raw.get("event_id")
    return event_id if isinstance(event_id, str) and len(event_id) <= MAX_ID_CHARS else None


def validation_problem(exc: ValidationError, where: str, prefix: str = "") -> ProtocolError:
    """The first problem pydantic found, as a `bad_event` naming the field."""
    return field_problem(exc.errors()[0], where, prefix)


def field_problem(error: ErrorDetails, where: str, prefix: str = "") -> ProtocolError:
    """One problem pydantic found, as a `bad_event` naming the field."""
    loc = error["loc"]
    # Unions add the member they tried to the location ("max_tokens.constrained-int",
    # "content.0.input_audio.audio", "input.0.item_reference.id"); those are not fields.
    parts = [str(p) for i, p in enumerate(loc)
             if not (isinstance(p, str) and (_UNION_MEMBER.match(p) or (i and isinstance(loc[i - 1], int)
                                                                         and p in PART_TAGS + INPUT_TAGS)))]
    param = ".".join(([prefix] if prefix else []) + parts)
    return ProtocolError("bad_event", f"{where}: {param}: {error['msg']}", param or None)


def parse_client_event(raw: dict[str, Any]) -> ClientEvent:
    """Validate one decoded JSON object; raises ProtocolError (bad_event / unknown_event)."""
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("bad_event", "event must be an object with a string 'type'", "type")
    model = EVENT_MODELS.get(canonical_type(kind))
    if model is None:
        raise ProtocolError("unknown_event", f"Unknown event type: {kind[:100]}", "type")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise validation_problem(exc, kind) from None


def token_limit(value: int | str | None) -> int | Literal["inf"]:
    """A validated TokenLimit as a number of tokens, or "inf"."""
    return value if isinstance(value, int) else "inf"
