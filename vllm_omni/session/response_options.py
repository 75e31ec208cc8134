"""What one response is asked for: the session's settings with a response.create's overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_omni.audio.formats import AudioFormat
from vllm_omni.engine.request import ToolChoice
from vllm_omni.protocol.client_events import token_limit
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.session_config import SessionConfig, parse_format
from vllm_omni.session.tools import engine_tool_choice, engine_tools

TOKEN_LIMIT_KEYS = ("max_output_tokens", "max_response_output_tokens", "max_tokens")


@dataclass
class ResponseOptions:
    modalities: list[str]
    output_format: AudioFormat
    voice: str | None  # as the client named it (echoed)
    speaker: str | None  # the engine's voice for it; None: the engine's default
    instructions: str | None
    max_output_tokens: int | str  # a number, or "inf"
    temperature: float | None
    metadata: dict[str, str] | None = None  # the client's (GA: strings only), echoed as given
    client_limited: bool = False  # max_output_tokens came from the client
    in_conversation: bool = True  # False for `conversation: "none"` (out-of-band answers)
    # playback_commit_policy ack_only: the text enters the history once acks cover the audio
    # (docs/realtime-api.md §13.5), not when the response completes
    history_on_ack: bool = False
    tools: list[dict[str, Any]] = field(default_factory=list)  # as the engine takes them
    tool_choice: ToolChoice = "auto"


def response_options(config: SessionConfig, overrides: dict[str, Any], speakers: list[str],
                     default_speaker: str | None) -> ResponseOptions:
    """`overrides` are a response.create's `response` fields as sent (validated by their model)."""
    modalities = overrides.get("output_modalities", overrides.get("modalities"))
    if modalities is not None:
        if not isinstance(modalities, list) or not modalities or any(m not in ("audio", "text") for m in modalities):
            raise ProtocolError("bad_event", "output_modalities must list 'audio' and/or 'text'",
                                "response.output_modalities")
        modalities = ["text", "audio"] if "audio" in modalities else ["text"]
    out_fmt = overrides.get("output_audio_format", overrides.get("response_format"))
    nested = overrides.get("audio", {}).get("output", {}) if isinstance(overrides.get("audio"), dict) else {}
    out_fmt = out_fmt if out_fmt is not None else nested.get("format")
    voice = overrides.get("voice", nested.get("voice", config.voice))
    if voice is not None and not isinstance(voice, str):
        raise ProtocolError("bad_event", "voice must be a name (voice objects are not supported)",
                            "response.audio.output.voice")
    tokens = token_limit(next((overrides[k] for k in TOKEN_LIMIT_KEYS if k in overrides), config.max_output_tokens))
    limited = isinstance(tokens, int)
    speaker = voice.lower() if voice is not None and voice.lower() in speakers else default_speaker
    metadata = overrides.get("metadata", config.metadata)
    return ResponseOptions(
        modalities=modalities or list(config.modalities),
        output_format=parse_format(out_fmt, output=True, param="response.output_audio_format")
        if out_fmt is not None else config.output_format,
        voice=voice, speaker=speaker, instructions=overrides.get("instructions", config.instructions),
        max_output_tokens=tokens if limited else "inf", temperature=overrides.get("temperature", config.temperature),
        metadata=None if metadata is None else dict(metadata), client_limited=limited,
        in_conversation=overrides.get("conversation") != "none",
        history_on_ack=config.playback_commit_policy == "ack_only",
        tools=engine_tools(overrides.get("tools", config.tools), "response.tools"),
        tool_choice=engine_tool_choice(overrides.get("tool_choice", config.tool_choice), "response.tool_choice"))
