"""`/v1/chat/completions` on the wire: OpenAI's request shape with audio output, and its
errors (docs/chat-completions.md).

A request is validated here field by field; a problem becomes a `ChatRequestError` naming
the parameter the way OpenAI does (`messages[1].content[0].input_audio.format`). Message
content is checked per role, so an error names the part that is wrong, not a union member.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from vllm_omni.protocol.errors import ProtocolError

MAX_STOP_STRINGS = 4  # as OpenAI
OUTPUT_FORMATS = ("wav", "pcm16")
INPUT_AUDIO_FORMATS = ("wav", "pcm16")
PART_TAGS = ("text", "input_audio", "image_url")  # what pydantic adds to a part's error location
UNION_MEMBER = re.compile(r"^(str|int|float|bool|dict\[.*|list\[.*|literal\[.*|[A-Z]\w*)$")  # `TextPart`…


class ChatRequestError(ProtocolError):
    """A request the endpoint refuses; `status` is the HTTP status it is answered with."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value", status: int = 400):
        super().__init__(code, message, param)
        self.status = status


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class InputAudio(_Strict):
    data: str = Field(min_length=1)  # base64
    format: str


class InputAudioPart(_Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


class ImageUrl(_Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None  # the model sees every image at one size


class ImageUrlPart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


UserPart = Annotated[TextPart | InputAudioPart | ImageUrlPart, Field(discriminator="type")]


class SystemMessage(_Strict):
    role: Literal["system", "developer"]
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(_Strict):
    role: Literal["user"]
    content: str | list[UserPart]
    name: str | None = None


class AudioReference(_Strict):
    id: str = Field(min_length=1)


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCallWire(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    audio: AudioReference | None = None  # an earlier answer's audio, by the id it was given
    tool_calls: list[ToolCallWire] | None = None
    refusal: str | None = None
    name: str | None = None


class ToolMessage(_Strict):
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str


ChatMessage = SystemMessage | UserMessage | AssistantMessage | ToolMessage
MESSAGE_MODELS: dict[str, TypeAdapter] = {
    role: TypeAdapter(model) for model, roles in ((SystemMessage, ("system", "developer")), (UserMessage, ("user",)),
                                                  (AssistantMessage, ("assistant",)), (ToolMessage, ("tool",)))
    for role in roles}


class AudioOutput(_Strict):
    voice: str
    format: str


class StreamOptions(_Strict):
    include_usage: bool = False


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Strict):
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)  # checked per role by `parse_messages`
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    max_completion_tokens: PositiveInt | None = None
    max_tokens: PositiveInt | None = None  # OpenAI's older name of max_completion_tokens
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)  # a 64-bit integer, as OpenAI
    stop: str | list[str] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    n: int | None = 1  # null: 1, as OpenAI
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # What clients and agent frameworks send at their defaults; other values are refused
    # (`unsupported_defaults`).
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: bool | None = None
    response_format: dict[str, Any] | None = None
    # Requests with the same key run on the same stage replicas, whose prefix caches hold
    # what they share (OpenAI's meaning: a hint that improves cache hits).
    prompt_cache_key: str | None = None
    # Accepted and ignored, as other OpenAI-compatible servers do: they change nothing the
    # model computes here (`store`: an answer is kept only for its audio id's lifetime).
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None

    @property
    def wants_audio(self) -> bool:
        return "audio" in (self.modalities or ["text"])

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def _param(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """pydantic's error location as OpenAI names a parameter: `messages[0].content[1].text`.
    Union members pydantic tried (`str`, `list[…]`, a part's `type` tag) are no fields."""
    text = prefix
    for i, part in enumerate(loc):
        if isinstance(part, int):
            text += f"[{part}]"
        elif not (i and isinstance(loc[i - 1], int) and part in PART_TAGS) and not UNION_MEMBER.match(part):
            text += f".{part}" if text else part
    return text


def _problem(errors: list[ErrorDetails], prefix: str = "") -> ChatRequestError:
    """The most specific problem: for `content: str | list[…]` given a list, the problem inside
    the list, not that it is no string."""
    error = max(errors, key=lambda e: len(e["loc"]))
    param = _param(error["loc"], prefix)
    if error["type"] == "extra_forbidden":
        return ChatRequestError(f"Unrecognized request argument supplied: {param}", param, "unknown_parameter")
    if error["type"] == "missing":
        return ChatRequestError(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    return ChatRequestError(f"Invalid value for '{param}': {error['msg']}.", param)


def parse_chat_request(raw: object) -> tuple[ChatCompletionRequest, list[ChatMessage]]:
    """The request and its messages, each of its role's shape; ChatRequestError naming the first
    wrong parameter, including the values this server does not serve (n > 1, audio formats)."""
    if not isinstance(raw, dict):
        raise ChatRequestError("The request body must be a JSON object.")
    try:
        request = ChatCompletionRequest.model_validate(raw)
    except ValidationError as exc:
        raise _problem(exc.errors()) from None
    if request.n not in (None, 1):
        raise ChatRequestError(f"n must be 1 (one choice per request), got {request.n}.", "n", "unsupported_value")
    stops = request.stop_strings
    if len(stops) > MAX_STOP_STRINGS or not all(stops):
        raise ChatRequestError(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings.", "stop")
    if request.wants_audio:
        if request.audio is None:
            raise ChatRequestError('Missing required parameter: \'audio\' (modalities include "audio").', "audio",
                                   "missing_required_parameter")
        if request.audio.format not in OUTPUT_FORMATS:
            raise ChatRequestError(f"audio.format {request.audio.format!r} is not supported: use "
                                   f"{' or '.join(OUTPUT_FORMATS)}.", "audio.format", "unsupported_value")
        if request.stream and request.audio.format != "pcm16":
            raise ChatRequestError("audio.format must be 'pcm16' when stream is true.", "audio.format",
                                   "unsupported_value")
    if request.stream_options is not None and not request.stream:
        raise ChatRequestError("stream_options is only allowed when stream is true.", "stream_options")
    unsupported_defaults(request)
    return request, parse_messages(request.messages)


def unsupported_defaults(request: ChatCompletionRequest) -> None:
    """Parameters this server takes only at their default: 0 penalties, no logprobs, text."""
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(request, name) not in (None, 0):
            raise ChatRequestError(f"{name} is not supported (only 0).", name, "unsupported_value")
    if request.logprobs:
        raise ChatRequestError("logprobs are not supported.", "logprobs", "unsupported_value")
    if request.response_format not in (None, {"type": "text"}):
        raise ChatRequestError('response_format is not supported (only {"type": "text"}).', "response_format",
                               "unsupported_value")


def parse_messages(messages: list[dict[str, Any]]) -> list[ChatMessage]:
    parsed = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in MESSAGE_MODELS:
            raise ChatRequestError(f"Invalid value for '{where}.role': expected one of "
                                   f"{', '.join(MESSAGE_MODELS)}, got {role!r}.", f"{where}.role")
        try:
            parsed.append(MESSAGE_MODELS[role].validate_python(message))
        except ValidationError as exc:
            raise _problem(exc.errors(), where) from None
    return parsed


def error_body(problem: ProtocolError, error_type: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": problem.message, "type": error_type, "param": problem.param, "code": problem.code}}
