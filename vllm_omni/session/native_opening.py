"""A native duplex session's opening (docs/realtime-api.md §13.7): its model-facing fields,
checked, and the model context they start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from vllm_omni.audio.voice_prompt import decode_voice_prompt
from vllm_omni.engine.native_duplex import DEFAULT_WINDOW, ContextWindow, DuplexOpening, ScriptedDecision, WindowMode
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.session.base import SessionOptions

TEST_DECISIONS = get_args(ScriptedDecision)
WINDOW_SIZES = {"basic_window_high_tokens": "high_tokens", "basic_window_low_tokens": "low_tokens",
                "context_max_units": "max_units", "context_previous_max_tokens": "previous_max_tokens"}
WINDOW_KEYS = ("sliding_window_mode", *WINDOW_SIZES)
# What the deploy sets, never a client (docs/realtime-api.md §13.7); `initial_user_text` is the
# session field's name (or `extra_body.duplex_initial_user_text`), reserved here.
SERVER_OWNED_KEYS = ("duplex_stage_sampling_params", "duplex_stage_max_tokens", "duplex_stage0_max_tokens",
                     "duplex_scheduler_token_id", "duplex_vision_tile_pixels", "duplex_first_append_context_tokens",
                     "ref_audio_data", "ref_audio_format", "ref_audio_sample_rate_hz", "initial_user_text",
                     "duplex_window_config", "duplex_window_prefix_tokens", "duplex_window_suffix_token_ids",
                     "duplex_window_previous_marker_token_ids", "duplex_window_special_token_ids")
# response.create fields a native session cannot apply to one answer (docs/realtime-api.md §13.7)
GENERATION_OVERRIDES = ("instructions", "voice", "temperature", "max_output_tokens", "max_response_output_tokens",
                        "max_tokens", "tools", "tool_choice")


@dataclass(frozen=True)
class NativeSettings:
    """A native session's model-facing fields (fixed when it opens)."""

    auto_response: bool  # the model hears the input as it arrives (else: at each commit)
    force_listen_count: int
    test_decisions: tuple[str, ...]
    window: ContextWindow


def native_settings(opening: dict[str, Any], options: SessionOptions) -> NativeSettings:
    """The opening's model-facing `extra_body` fields, checked."""
    extra = opening.get("extra_body") or {}
    if not isinstance(extra, dict):
        raise ProtocolError("invalid_session_config", "extra_body must be an object", "extra_body")
    check_server_owned(extra)
    auto_response = extra.get("auto_response", False)
    if not isinstance(auto_response, bool):
        raise ProtocolError("invalid_session_config", "auto_response must be true or false",
                            "extra_body.auto_response")
    count = extra.get("force_listen_count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ProtocolError("invalid_session_config", "force_listen_count must be a non-negative integer",
                            "extra_body.force_listen_count")
    script = extra.get("duplex_test_decisions")
    if script is not None:
        if not options.native_duplex.allow_test_decisions:
            raise ProtocolError("invalid_session_config", "duplex_test_decisions is a test control this deploy "
                                "does not enable", "extra_body.duplex_test_decisions")
        if not isinstance(script, list) or any(step not in TEST_DECISIONS for step in script):
            raise ProtocolError("invalid_session_config", f"duplex_test_decisions must be a list of "
                                f"{', '.join(TEST_DECISIONS)}", "extra_body.duplex_test_decisions")
    return NativeSettings(auto_response, count, tuple(script or ()), context_window(extra))


def check_server_owned(extra: dict[str, Any]) -> None:
    """`invalid_duplex_runtime_config` naming the server-owned keys `extra` sets, if any."""
    owned = [key for key in SERVER_OWNED_KEYS if key in extra]
    if owned:
        raise ProtocolError("invalid_duplex_runtime_config", f"duplex runtime configuration is server-owned: "
                            f"{', '.join(owned)}", f"extra_body.{owned[0]}")


def check_response_options(response: ce.ResponseSettings) -> None:
    """`unsupported_native_response_options` naming the overrides a response.create sets: the
    model answers in the context and voice its session opened with."""
    output = response.audio.output if response.audio is not None else None
    refused = [name for name in GENERATION_OVERRIDES if getattr(response, name) is not None]
    refused += ["audio.output.voice"] if output is not None and output.voice is not None else []
    if refused:
        raise ProtocolError("unsupported_native_response_options", f"this model does not support generation "
                            f"overrides on response.create: {', '.join(refused)}", f"response.{refused[0]}")


def context_window(extra: dict[str, Any]) -> ContextWindow:
    """The `extra_body` window keys (docs/minicpmo.md, "Context windows"), checked."""
    mode = extra.get("sliding_window_mode", DEFAULT_WINDOW.mode)
    if mode not in get_args(WindowMode):
        raise ProtocolError("invalid_sliding_window_config", f"sliding_window_mode must be one of "
                            f"{', '.join(get_args(WindowMode))}", "extra_body.sliding_window_mode")
    sizes = {}
    for key, name in WINDOW_SIZES.items():
        value = extra.get(key, getattr(DEFAULT_WINDOW, name))
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ProtocolError("invalid_sliding_window_config", f"{key} must be a positive integer",
                                f"extra_body.{key}")
        sizes[name] = value
    if sizes["low_tokens"] >= sizes["high_tokens"]:
        raise ProtocolError("invalid_sliding_window_config", "basic_window_low_tokens must be below "
                            "basic_window_high_tokens", "extra_body.basic_window_low_tokens")
    return ContextWindow(mode, **sizes)


def native_opening(opening: dict[str, Any], wants_audio: bool, settings: NativeSettings) -> DuplexOpening:
    """The model context's start: instructions and the voice prompt (required for audio output)."""
    ref_audio = opening.get("ref_audio")
    if ref_audio is None:
        if wants_audio:
            raise ProtocolError("ref_audio_required", "this model speaks in the voice of ref_audio: send it "
                                "(a WAV data URL) when the session opens, or ask for text only", "ref_audio")
        voice = None
    else:
        if not isinstance(ref_audio, str):
            raise ProtocolError("invalid_session_config", "ref_audio must be a WAV data URL", "ref_audio")
        try:
            voice = decode_voice_prompt(ref_audio)
        except ValueError as exc:
            raise ProtocolError("invalid_session_config", str(exc), "ref_audio") from None
    instructions = opening.get("instructions")
    extra = opening.get("extra_body") or {}
    user_text = opening.get("initial_user_text", extra.get("duplex_initial_user_text"))
    if user_text is not None and not isinstance(user_text, str):
        raise ProtocolError("invalid_session_config", "initial_user_text must be a string", "initial_user_text")
    return DuplexOpening(instructions=instructions if isinstance(instructions, str) and instructions else None,
                         initial_user_text=user_text or None, voice_prompt=voice, wants_audio=wants_audio,
                         force_listen_count=settings.force_listen_count, test_decisions=settings.test_decisions,
                         window=settings.window)
