"""What a caller hands the engine and what it gets back."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

import numpy as np

from vllm_omni.audio.log_mel import StreamingLogMel
from vllm_omni.audio.pcm import MODEL_RATE, validate_model_audio


class RequestError(ValueError):
    """A request the engine cannot take; the message names what is wrong. Nothing else is affected."""


class EngineBusyError(RequestError):
    """Refused because the engine already runs as many requests as it queues; retrying later
    may succeed."""

    code = "engine_busy"


class StageUnavailableError(RequestError):
    """Refused because a stage's worker or engine is dead (or restarting); the message names
    the stage. Retrying later may succeed if the stage restarts."""

    code = "stage_unavailable"


class AudioInputStream:
    """User audio handed over while the user is still speaking.

    Log-mel frames are computed as samples arrive (audio/log_mel.py), so when the turn ends
    only the last few frames remain; the features equal a one-shot extraction. The stream
    keeps features, not samples.
    """

    def __init__(self) -> None:
        self._mel = StreamingLogMel()
        self.closed = False

    def append(self, samples: np.ndarray, sample_rate: int = MODEL_RATE) -> None:
        if self.closed:
            raise RequestError("audio stream is closed")
        self._take(validate_model_audio(samples, sample_rate, "streamed audio"))

    def _take(self, samples: np.ndarray) -> None:
        self._mel.append(samples)

    @property
    def num_samples(self) -> int:
        return self._mel.num_samples

    def close(self):
        """End of turn: compute the tail frames; return the [128, frames] features. Later
        calls return the same features, so a conversation can keep them for every turn
        instead of the samples."""
        if not self.closed:
            self._mel.finish()
            self.closed = True
        return self._mel.features()


@dataclass(frozen=True)
class ToolCall:
    """A function call the model made; `arguments` is a JSON object as text."""

    call_id: str
    name: str
    arguments: str


@dataclass
class Message:
    """One conversation turn. A user turn may carry text, audio (16 kHz mono float32), or
    an `AudioInputStream` that is still being filled when the request is submitted, and
    images: encoded JPEG or PNG bytes, decoded by the model family when it builds the prompt
    (bytes it cannot decode fail the request, naming the image). The model sees a user
    turn's images first, in order, then its audio, then its text. An assistant turn may
    carry the tool calls it made, and the token ids the model generated for it
    (`RequestFinished.token_ids`): while they still spell `text`, the prompt holds them as they
    are instead of `text` tokenized again, so the prefix cache keeps the KV of their generation
    (docs/realtime-api.md §10, "prompt"). A "tool" turn carries one call's result (`text`)
    for `tool_call_id`."""

    role: Literal["system", "user", "assistant", "tool"]
    text: str | None = None
    audio: np.ndarray | None = None
    sample_rate: int = MODEL_RATE  # of `audio`: what the model hears
    audio_stream: AudioInputStream | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    images: list[bytes] = field(default_factory=list)
    token_ids: tuple[int, ...] = ()


ToolChoice = Literal["auto", "none", "required"] | str  # or the name of the one function to call


@dataclass
class OmniRequest:
    messages: list[Message]
    request_id: str = field(default_factory=lambda: f"req-{uuid.uuid4().hex[:16]}")
    speaker: str | None = None  # a voice of the model (`OmniEngine.speakers`); None: its default
    modalities: tuple[str, ...] = ("text", "audio")
    # Limits of the text answer, applied to the stage that writes it (whichever role that is).
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    # Text that ends the answer where it first appears: neither the text nor the speech
    # includes it (engine/stop_strings.py).
    stop: tuple[str, ...] = ()
    seed: int | None = None  # of every stage's sampling (each stage gets it unless it sets its own)
    # Per-stage sampling overrides by role as the deploy config names them; these win.
    sampling: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Functions the model may call: {"name", "description", "parameters" (JSON schema)} each.
    # "required" or a function's name forces a call whose arguments match its schema.
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    # Requests with the same key run on the same replica of each stage while it is up (a
    # realtime session's id: its next turn extends this prompt, and that replica's prefix
    # cache holds it); None: the least loaded replicas (engine/replicas.py).
    affinity_key: str | None = None


class FinishReason(str, Enum):
    STOP = "stop"  # the model ended its answer
    LENGTH = "length"  # a token limit ended it
    ABORT = "abort"  # the caller stopped it
    ERROR = "error"  # a stage failed (see `error`, `error_code`)


@dataclass(frozen=True)
class TextDelta:
    request_id: str
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class AudioChunk:
    request_id: str
    pcm16: bytes  # little-endian int16 mono
    sample_rate: int
    start_s: float  # position of the chunk's first sample in the response audio
    end_s: float  # cumulative duration of the response audio after this chunk
    # The response's last chunk, where the stage that made it knew (docs/realtime-api.md §5.4,
    # `end_of_turn`); a last chunk whose frames decode to no sample leaves it on none.
    final: bool = False


@dataclass(frozen=True)
class StageMetrics:
    """Timing of one stage for one request; `role` and `stage_id` as the deploy config names them."""

    role: str
    stage_id: int
    first_output_s: float | None  # from request arrival (TTFT for token stages)
    mean_interval_s: float | None  # TPOT for token stages
    intervals_s: tuple[float, ...]
    outputs: int
    finish_reason: FinishReason | None = None  # set on the stage that writes the text answer


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    image_tokens: int = 0  # prompt positions holding images (of prompt_tokens)
    input_audio_tokens: int = 0  # prompt positions holding audio (of prompt_tokens)
    text_tokens: int = 0  # generated text tokens
    audio_tokens: int = 0  # generated audio tokens (codec frames), 0 for a text-only answer
    cached_tokens: int = 0  # of prompt_tokens: served from the text stage's prefix cache


@dataclass(frozen=True)
class RequestFinished:
    request_id: str
    finish_reason: FinishReason
    text: str = ""
    token_ids: tuple[int, ...] = ()
    usage: Usage = field(default_factory=Usage)
    audio_duration_s: float = 0.0
    time_to_first_audio_s: float | None = None
    stage_metrics: dict[str, StageMetrics] = field(default_factory=dict)  # by role
    tool_calls: tuple[ToolCall, ...] = ()  # in the order they were made (also streamed as outputs)
    error: str | None = None
    error_code: str | None = None  # "stage_unavailable" when a stage died under the request


EngineOutput = TextDelta | AudioChunk | ToolCall | RequestFinished
