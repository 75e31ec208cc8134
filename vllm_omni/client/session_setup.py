"""`session.update` events in the two shapes servers accept: GA nested and flat (beta)."""

from __future__ import annotations

from typing import Any


def ga_session_update(*, model: str | None = None, server_vad: bool = False, instructions: str | None = None,
                      voice: str | None = None, output_modalities: tuple[str, ...] = ("audio",),
                      input_rate: int = 16000, vad: dict[str, Any] | None = None) -> dict[str, Any]:
    """GA shape: `session.type = realtime`, audio settings under `session.audio`."""
    turn_detection = {"type": "server_vad", **(vad or {})} if server_vad else None
    session: dict[str, Any] = {
        "type": "realtime", "output_modalities": list(output_modalities),
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": input_rate}, "turn_detection": turn_detection},
                  "output": {"format": {"type": "audio/pcm", "rate": 24000}}}}
    if voice is not None:
        session["audio"]["output"]["voice"] = voice
    if model is not None:
        session["model"] = model
    if instructions is not None:
        session["instructions"] = instructions
    return {"type": "session.update", "session": session}


def flat_session_update(*, model: str | None = None, server_vad: bool = False, instructions: str | None = None,
                        voice: str | None = None, modalities: tuple[str, ...] = ("audio", "text"),
                        vad: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """Flat (beta) shape: formats and turn detection as top-level keys of `session`;
    `extra` adds further keys as they are (e.g. `ref_audio`, `extra_body`)."""
    session: dict[str, Any] = {
        "modalities": list(modalities), "input_audio_format": "pcm16", "output_audio_format": "pcm16",
        "turn_detection": {"type": "server_vad", **(vad or {})} if server_vad else None, **extra}
    for key, value in (("model", model), ("instructions", instructions), ("voice", voice)):
        if value is not None:
            session[key] = value
    return {"type": "session.update", "session": session}
