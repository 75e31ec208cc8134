"""`session.update` events in the two shapes servers accept: GA nested and flat (beta)."""

from __future__ import annotations

from typing import Any

from vllm_omni.client.events import session_update
from vllm_omni.protocol import client_events as ce


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that are not None: the others are left off the wire."""
    return {key: value for key, value in fields.items() if value is not None}


def _turn_detection(server_vad: bool, vad: dict[str, Any] | None) -> dict[str, Any] | None:
    """Server VAD with `vad`'s settings, or None (sent as null: no server VAD)."""
    return {"type": "server_vad", **(vad or {})} if server_vad else None


def ga_session_update(*, model: str | None = None, server_vad: bool = False, instructions: str | None = None,
                      voice: str | None = None, output_modalities: tuple[str, ...] = ("audio",),
                      input_rate: int = 16000, vad: dict[str, Any] | None = None,
                      transcription: dict[str, Any] | None = None) -> dict[str, Any]:
    """GA shape: `session.type = realtime`, audio settings under `session.audio`."""
    audio = ce.AudioSettings(
        input=ce.AudioInputSettings(format={"type": "audio/pcm", "rate": input_rate},
                                    turn_detection=_turn_detection(server_vad, vad),
                                    **_given(transcription=transcription)),
        output=ce.AudioOutputSettings(format={"type": "audio/pcm", "rate": 24000}, **_given(voice=voice)))
    return session_update(ce.SessionSettings(type="realtime", output_modalities=list(output_modalities), audio=audio,
                                             **_given(model=model, instructions=instructions)))


def flat_session_update(*, model: str | None = None, server_vad: bool = False, instructions: str | None = None,
                        voice: str | None = None, modalities: tuple[str, ...] = ("audio", "text"),
                        vad: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """Flat (beta) shape: formats and turn detection as top-level keys of `session`;
    `extra` adds further keys as they are (e.g. `ref_audio`, `extra_body`)."""
    return session_update(ce.SessionSettings.model_validate({
        "modalities": list(modalities), "input_audio_format": "pcm16", "output_audio_format": "pcm16",
        "turn_detection": _turn_detection(server_vad, vad), **extra,
        **_given(model=model, instructions=instructions, voice=voice)}))
