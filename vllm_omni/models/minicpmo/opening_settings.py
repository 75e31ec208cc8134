"""MiniCPM-o's own opening settings: the session object's `extra_body` keys this model reads
when a session opens (docs/minicpmo.md, "Context windows"; docs/realtime-api.md §13.7), checked
here and refused with the protocol's codes (engine/native_duplex.py SettingRefused)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from vllm_omni.engine.native_duplex import SettingRefused

ScriptedDecision = Literal["listen", "speak", "speak_end"]  # test-only per-unit decisions (docs/minicpmo.md)
WindowMode = Literal["off", "basic", "context"]
TEST_DECISIONS = get_args(ScriptedDecision)
WINDOW_SIZES = {"basic_window_high_tokens": "high_tokens", "basic_window_low_tokens": "low_tokens",
                "context_max_units": "max_units", "context_previous_max_tokens": "previous_max_tokens"}
WINDOW_KEYS = ("sliding_window_mode", *WINDOW_SIZES)
SETTING_KEYS = frozenset({"force_listen_count", "duplex_test_decisions", *WINDOW_KEYS})


@dataclass(frozen=True)
class ContextWindow:
    """How a session's model context stays bounded (docs/minicpmo.md, "Context windows").

    `basic`: past `high_tokens` positions, the oldest units go, down to `low_tokens`.
    `context`: beyond `max_units` units, the oldest go, but up to `previous_max_tokens` of
    their text stays in the system turn. `off`: the context grows until the engine's own
    limit nears; then units go as in `basic`."""

    mode: WindowMode = "off"
    high_tokens: int = 8000
    low_tokens: int = 6000
    max_units: int = 24
    previous_max_tokens: int = 500


DEFAULT_WINDOW = ContextWindow()


@dataclass(frozen=True)
class OpeningSettings:
    force_listen_count: int = 0  # the first units of every model turn listen (0: off)
    test_decisions: tuple[ScriptedDecision, ...] = ()  # per session unit, for tests only
    window: ContextWindow = DEFAULT_WINDOW


def opening_settings(settings: Mapping[str, Any]) -> OpeningSettings:
    """`settings` (the keys of SETTING_KEYS an opening set) checked; SettingRefused naming the
    first that is wrong."""
    count = settings.get("force_listen_count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise SettingRefused("invalid_session_config", "force_listen_count must be a non-negative integer",
                             "force_listen_count")
    script = settings.get("duplex_test_decisions") or []
    if not isinstance(script, list) or any(step not in TEST_DECISIONS for step in script):
        raise SettingRefused("invalid_session_config", f"duplex_test_decisions must be a list of "
                             f"{', '.join(TEST_DECISIONS)}", "duplex_test_decisions")
    return OpeningSettings(count, tuple(script), context_window(settings))


def context_window(settings: Mapping[str, Any]) -> ContextWindow:
    mode = settings.get("sliding_window_mode", DEFAULT_WINDOW.mode)
    if mode not in get_args(WindowMode):
        raise SettingRefused("invalid_sliding_window_config", f"sliding_window_mode must be one of "
                             f"{', '.join(get_args(WindowMode))}", "sliding_window_mode")
    sizes = {}
    for key, name in WINDOW_SIZES.items():
        value = settings.get(key, getattr(DEFAULT_WINDOW, name))
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SettingRefused("invalid_sliding_window_config", f"{key} must be a positive integer", key)
        sizes[name] = value
    if sizes["low_tokens"] >= sizes["high_tokens"]:
        raise SettingRefused("invalid_sliding_window_config", "basic_window_low_tokens must be below "
                             "basic_window_high_tokens", "basic_window_low_tokens")
    return ContextWindow(mode, **sizes)


def check_update(settings: Mapping[str, Any]) -> None:
    """The window is the context's shape: it can only be set when the session opens."""
    window = next((key for key in WINDOW_KEYS if key in settings), None)
    if window is not None:
        raise SettingRefused("sliding_window_update_unsupported", f"{window} can only be set when the session "
                             "opens", window)
