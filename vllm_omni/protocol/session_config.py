"""Session configuration: the effective configuration, the parsers of its audio formats and
turn detection, and its echo. Applying a `session.update` to it is session_update's
(docs/realtime-api.md §2.2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vllm_omni.audio.formats import (
    DEFAULT_RATES,
    OUTPUT_SPELLINGS,
    AudioFormat,
    AudioFormatError,
    canonical_format,
    check_rate,
)
from vllm_omni.protocol.errors import ProtocolError

# The GA wire default for output audio (pcm16 and wav are always sent at it). Not the engine's
# rate: the engine's audio is resampled to the session's output format (audio/formats.encode_output).
OUTPUT_RATE = 24000
# GA's input rate: audio a session receives without a rate of its own is 24 kHz PCM16 (resampled to
# the model's 16 kHz); other rates are an extension a client declares (docs/realtime-api.md §3.1).
INPUT_RATE = 24000
# Server-VAD values a deploy may set for sessions whose client turns server_vad on without them.
TURN_DETECTION_DEFAULT_FIELDS = ("threshold", "silence_duration_ms", "prefix_padding_ms")
TURN_DETECTION_FIELDS = {"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response",
                         "interrupt_response", "idle_timeout_ms", "min_speech_duration_ms"}
MAX_VAD_DURATION_MS = 60_000  # prefix padding, silence and minimum speech durations
MAX_IDLE_TIMEOUT_MS = 86_400_000


# semantic_vad by eagerness (docs/realtime-api.md §2.4.2): after `check` ms of silence the
# end-of-turn model judges the speech so far and ends a turn that sounds finished; one it finds
# unfinished ends after `max` ms of silence (GA's 8 / 4 / 2 s timeouts). "auto" is "medium".
SEMANTIC_VAD_PAUSES_MS = {"low": (600.0, 8000.0), "medium": (400.0, 4000.0), "auto": (400.0, 4000.0),
                          "high": (200.0, 2000.0)}
SEMANTIC_VAD_FIELDS = {"type", "eagerness", "create_response", "interrupt_response"}


class TurnDetection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    eagerness: Literal["low", "medium", "high", "auto"] | None = None  # semantic_vad only
    threshold: float = 0.5
    prefix_padding_ms: float = 300
    silence_duration_ms: float = 500
    create_response: bool = True
    interrupt_response: bool = False
    idle_timeout_ms: int | None = None
    min_speech_duration_ms: float = 96


class SessionConfig(BaseModel):
    """The effective configuration of one realtime session."""

    id: str
    model: str
    instructions: str | None = None
    modalities: list[str] = Field(default_factory=lambda: ["text", "audio"])
    input_format: AudioFormat = AudioFormat("pcm16", INPUT_RATE)
    output_format: AudioFormat = AudioFormat("pcm16", OUTPUT_RATE)
    turn_detection: TurnDetection | None = None
    transcription: Any = None
    noise_reduction: Any = None
    voice: str | None = None
    speed: float | None = None
    max_output_tokens: int | Literal["inf"] = "inf"
    temperature: float | None = None
    tools: list[Any] = Field(default_factory=list)
    tool_choice: Any = "auto"
    metadata: Any = None
    include: Any = None
    prompt: Any = None
    tracing: Any = None
    truncation: Any = None
    idle_timeout_s: float = 300.0
    playback_commit_policy: Literal["commit_all_on_done", "ack_only"] = "commit_all_on_done"
    # overlap rules (docs/realtime-api.md §13.6): speech over an answer up to this long is a
    # back-channel; below this RMS an append without hints is not speech; the barge-in
    # threshold is accepted and echoed for compatibility, no rule uses it
    overlap_short_ack_ms: int | float = 700
    overlap_barge_in_ms: int | float = 1200
    overlap_silence_rms: int | float = 0.003
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @property
    def wants_audio(self) -> bool:
        return "audio" in self.modalities

    @property
    def overlap_policy(self) -> str:
        td = self.turn_detection
        return "barge_in_on_speech" if td is not None and td.interrupt_response else "listen_only"


def parse_format(value: Any, *, output: bool, param: str) -> AudioFormat:
    """A string or `{type|format, rate|sample_rate_hz|sample_rate}` object."""
    code = "unsupported_audio_format"
    kind = "output_audio_format" if output else "input_audio_format"
    rate = None
    if isinstance(value, dict):
        name = value.get("type", value.get("format"))
        for key in ("rate", "sample_rate_hz", "sample_rate"):
            if key in value:
                try:
                    rate = check_rate(value[key], key)
                except ValueError as exc:
                    raise ProtocolError("bad_event", str(exc), param) from None
                break
        ga_object = True
    else:
        name, ga_object = value, False
    if not isinstance(name, str):
        raise ProtocolError(code, f"Unsupported {kind}: {value!r}", param)
    try:
        canonical = canonical_format(name, OUTPUT_SPELLINGS) if output else canonical_format(name)
    except AudioFormatError:
        raise ProtocolError(code, f"Unsupported {kind}: {name}", param) from None
    if output and canonical in ("pcm16", "wav"):
        return AudioFormat(canonical, OUTPUT_RATE)  # the GA wire rate, whatever rate was asked
    if rate is None:  # GA `audio/pcm` objects default to 24 kHz (GA semantics), flat names to their own rate
        rate = INPUT_RATE if (ga_object and not output and canonical == "pcm16") else DEFAULT_RATES[canonical]
    return AudioFormat(canonical, rate)


def _is_duration(value: Any, limit: float = MAX_VAD_DURATION_MS) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and 0 <= value <= limit


def parse_turn_detection(value: Any, mode: str, defaults: Mapping[str, float] | None = None) -> TurnDetection | None:
    """`value` as sent; `defaults` (the deploy's, TURN_DETECTION_DEFAULT_FIELDS) fill what it leaves out."""
    param = "turn_detection"
    code = "unsupported_turn_detection"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError(code, "turn_detection must be null or an object", param)
    if value.get("type") == "semantic_vad":
        return _semantic_vad(value, mode, defaults)
    if value.get("type") != "server_vad":
        raise ProtocolError(code, f"turn_detection type {value.get('type')!r} is not supported "
                                  "(server_vad or semantic_vad)", param)
    unknown = sorted(set(value) - TURN_DETECTION_FIELDS)
    if unknown:
        raise ProtocolError(code, f"unknown turn_detection fields: {', '.join(unknown)}", param)
    threshold = value.get("threshold", 0.5)
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0.15 < threshold <= 1:
        raise ProtocolError(code, "turn_detection.threshold must be in (0.15, 1]", param)
    for key in ("prefix_padding_ms", "silence_duration_ms", "min_speech_duration_ms"):
        if key in value and not _is_duration(value[key]):
            raise ProtocolError(code, f"turn_detection.{key} must be a number of ms in "
                                      f"[0, {MAX_VAD_DURATION_MS}]", param)
    idle = value.get("idle_timeout_ms")
    if idle is not None and not (isinstance(idle, int) and _is_duration(idle, MAX_IDLE_TIMEOUT_MS)):
        raise ProtocolError(code, "turn_detection.idle_timeout_ms must be null or an integer number of ms in "
                                  f"[0, {MAX_IDLE_TIMEOUT_MS}]", param)
    for key in ("create_response", "interrupt_response"):
        if key in value and not isinstance(value[key], bool):
            raise ProtocolError(code, f"turn_detection.{key} must be true or false", param)
    fields = {**(defaults or {}), **{k: v for k, v in value.items() if k in TURN_DETECTION_FIELDS}}
    fields.setdefault("interrupt_response", mode != "turn")
    return TurnDetection(**fields)


def _semantic_vad(value: dict[str, Any], mode: str, defaults: Mapping[str, float] | None) -> TurnDetection:
    """semantic_vad: speech is found as with server_vad; the end of a turn is judged by the
    end-of-turn model, `eagerness` setting the pauses (SEMANTIC_VAD_PAUSES_MS)."""
    code, param = "unsupported_turn_detection", "turn_detection"
    unknown = sorted(set(value) - SEMANTIC_VAD_FIELDS)
    if unknown:
        raise ProtocolError(code, f"unknown semantic_vad fields: {', '.join(unknown)}", param)
    eagerness = value.get("eagerness", "auto")
    if eagerness not in SEMANTIC_VAD_PAUSES_MS:
        raise ProtocolError("invalid_value", "turn_detection.eagerness must be low, medium, high or auto",
                            f"{param}.eagerness")
    for key in ("create_response", "interrupt_response"):
        if key in value and not isinstance(value[key], bool):
            raise ProtocolError(code, f"turn_detection.{key} must be true or false", param)
    fields = {**(defaults or {}), **{k: v for k, v in value.items() if k in ("create_response", "interrupt_response")}}
    fields.setdefault("interrupt_response", mode != "turn")
    return TurnDetection(**{**fields, "type": "semantic_vad", "eagerness": eagerness,
                            "silence_duration_ms": SEMANTIC_VAD_PAUSES_MS[eagerness][1]})


def session_object(config: SessionConfig, state: dict[str, Any]) -> dict[str, Any]:
    """The `session` object of session.created / session.updated (docs/realtime-api.md §2.6)."""
    td = config.turn_detection.model_dump(exclude={"eagerness"} if config.turn_detection.eagerness is None else None) \
        if config.turn_detection else None
    return {
        "object": "realtime.session", "type": "realtime", "id": config.id, "model": config.model,
        "instructions": config.instructions, "output_modalities": list(config.modalities),
        "modalities": list(config.modalities),
        "audio": {"input": {"format": config.input_format.ga_object(), "sample_rate_hz": config.input_format.rate,
                            "turn_detection": td, "transcription": config.transcription,
                            "noise_reduction": config.noise_reduction},
                  "output": {"format": config.output_format.ga_object(), "voice": config.voice,
                             "speed": config.speed}},
        "turn_detection": td, "input_audio_format": config.input_format.name,
        "output_audio_format": config.output_format.name, "input_audio_transcription": config.transcription,
        "tracing": config.tracing, "max_output_tokens": config.max_output_tokens, "tools": config.tools,
        "tool_choice": config.tool_choice, "metadata": config.metadata, "include": config.include,
        "prompt": config.prompt, "voice": config.voice, "temperature": config.temperature,
        "max_tokens": config.max_output_tokens, "speed": config.speed,
        "response_format": "wav" if config.output_format.name == "wav" else "pcm",
        "idle_timeout_s": config.idle_timeout_s, "overlap_policy": config.overlap_policy,
        "overlap_short_ack_ms": config.overlap_short_ack_ms, "overlap_barge_in_ms": config.overlap_barge_in_ms,
        "overlap_silence_rms": config.overlap_silence_rms,
        "playback_commit_policy": config.playback_commit_policy, **state,
    }
