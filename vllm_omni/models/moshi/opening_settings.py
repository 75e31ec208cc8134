"""Moshi's own opening settings: the session object's `extra_body` keys it reads when a session
opens (docs/moshi.md, "Settings"), refused with the protocol's codes (SettingRefused)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from vllm_omni.engine.native_duplex import SettingRefused

# test-only per-frame script (MiniCPM-o's vocabulary): "listen" forces the frame quiet (padding
# text, the codes of silence in the model's own stream); "speak" says the model's frame as it is;
# "speak_end" says it and ends the model's turn with it
ScriptedFrame = Literal["listen", "speak", "speak_end"]
SETTING_KEYS = frozenset({"duplex_test_decisions"})


def scripted_frames(settings: Mapping[str, Any]) -> tuple[ScriptedFrame, ...]:
    script = settings.get("duplex_test_decisions") or []
    if not isinstance(script, list) or any(step not in get_args(ScriptedFrame) for step in script):
        raise SettingRefused("invalid_session_config", "duplex_test_decisions must be a list of "
                             f"{', '.join(get_args(ScriptedFrame))} (one per 80 ms frame)", "duplex_test_decisions")
    return tuple(script)
