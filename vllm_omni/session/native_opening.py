"""A native duplex session's opening (docs/realtime-api.md §13.7): its model-facing fields,
checked, and the model context they start."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from vllm_omni.audio.voice_prompt import decode_voice_prompt
from vllm_omni.engine.interface import UnitEngine
from vllm_omni.engine.native_duplex import DuplexOpening, SettingRefused
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.session.base import SessionOptions

TEST_DECISIONS_KEY = "duplex_test_decisions"  # a test control the deploy enables (NativeDuplexSettings)
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
    model_settings: Mapping[str, Any]  # the model's own keys (UnitEngine.setting_keys), checked by it


def native_settings(opening: dict[str, Any], options: SessionOptions, engine: UnitEngine) -> NativeSettings:
    """The opening's model-facing `extra_body` fields, checked (the model checks its own)."""
    extra = opening.get("extra_body") or {}
    if not isinstance(extra, dict):
        raise ProtocolError("invalid_session_config", "extra_body must be an object", "extra_body")
    check_server_owned(extra)
    auto_response = extra.get("auto_response", False)
    if not isinstance(auto_response, bool):
        raise ProtocolError("invalid_session_config", "auto_response must be true or false",
                            "extra_body.auto_response")
    if extra.get(TEST_DECISIONS_KEY) is not None and not options.native_duplex.allow_test_decisions:
        raise ProtocolError("invalid_session_config", "duplex_test_decisions is a test control this deploy "
                            "does not enable", f"extra_body.{TEST_DECISIONS_KEY}")
    model_settings = {key: value for key, value in extra.items() if key in engine.setting_keys}
    with refused_as_protocol_error("extra_body."):
        engine.check_settings(model_settings)
    return NativeSettings(auto_response, model_settings)


def check_model_update(update: dict[str, Any], engine: UnitEngine) -> None:
    """What the model says a session.update may not change (its keys, in the update or in
    its extra_body)."""
    extra = update.get("extra_body") if isinstance(update.get("extra_body"), dict) else {}
    changed = {key: value for source in (update, extra) for key, value in source.items()
               if key in engine.setting_keys}
    with refused_as_protocol_error(""):
        engine.check_update(changed)


@contextmanager
def refused_as_protocol_error(param_prefix: str) -> Iterator[None]:
    try:
        yield
    except SettingRefused as refused:
        raise ProtocolError(refused.code, refused.message, param_prefix + refused.key) from None


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


def native_opening(opening: dict[str, Any], wants_audio: bool, settings: NativeSettings,
                   needs_voice_prompt: bool) -> DuplexOpening:
    """The model context's start: instructions and the voice prompt (required for audio output
    from a model that speaks in the prompt's voice)."""
    ref_audio = opening.get("ref_audio")
    if ref_audio is None:
        if wants_audio and needs_voice_prompt:
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
                         settings=settings.model_settings)
