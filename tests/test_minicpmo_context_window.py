"""A duplex session's context window on its own (docs/minicpmo.md, "Context windows"): which
units go when the context outgrows it, and what the rebuilt context holds."""

from __future__ import annotations

import torch

from vllm_omni.models.minicpmo.context_window import KeptUnit, Rows, WindowState, runs_length
from vllm_omni.models.minicpmo.opening_settings import ContextWindow

SYSTEM = [[1] * 8]  # 8 positions before the previous text…
SUFFIX = [[2] * 2]  # …and 2 after it
MARKER = [3, 3]


def unit(number: int, said: list[int] | None = None) -> KeptUnit:
    """A 14-position unit: `<unit>`, 10 audio rows, a decision and its terminators."""
    return KeptUnit([[100 + number], Rows(torch.zeros(10, 4), "audio", "[audio×10]"), [7, 8, 9]], said or [])


def window(mode: str = "basic", limit: int | None = None, **sizes: int) -> WindowState:
    return WindowState(ContextWindow(mode, **sizes), SYSTEM, SUFFIX, MARKER, limit=limit, unit_headroom=20)


def unit_numbers(runs: list) -> list[int]:
    return [run[0] - 100 for run in runs if isinstance(run, list) and len(run) == 1 and run[0] >= 100]


def test_basic_drops_the_oldest_units_down_to_the_low_mark_once_past_the_high_mark() -> None:
    state = window(high_tokens=60, low_tokens=40)
    for number in range(3):  # 10 + 3 × 14 = 52 positions: inside the window
        state.keep(unit(number))
        assert state.slide() is None
    state.keep(unit(3))  # 66 > 60
    runs = state.slide()
    assert runs is not None and runs_length(runs) <= 40 and state.slides == 1
    assert runs[:2] == [*SYSTEM, *SUFFIX] and unit_numbers(runs) == [2, 3]  # the newest units, in order


def test_context_mode_keeps_the_newest_units_and_the_text_of_the_dropped_ones() -> None:
    state = window("context", max_units=2, previous_max_tokens=3)
    state.keep(unit(0, said=[50, 51]))
    state.keep(unit(1, said=[52, 53]))
    assert state.slide() is None
    state.keep(unit(2, said=[54]))
    runs = state.slide()
    assert unit_numbers(runs) == [1, 2]
    assert runs[:3] == [*SYSTEM, [*MARKER, 50, 51], *SUFFIX]  # the previous text sits inside the system turn
    state.keep(unit(3))
    runs = state.slide()
    assert unit_numbers(runs) == [2, 3] and runs[1] == [*MARKER, 51, 52, 53]  # at most 3 tokens, newest kept


def test_without_a_window_the_backend_limit_still_bounds_the_context() -> None:
    state = window("off", limit=100)  # a unit may not start past 80 positions
    slid = []
    for number in range(20):
        state.keep(unit(number))
        if (runs := state.slide()) is not None:
            slid.append(runs_length(runs))
        assert runs_length([*SYSTEM, *SUFFIX]) + sum(kept.length for kept in state.units) <= 80
    assert slid and all(length <= 60 for length in slid)  # down to three quarters of the ceiling


def test_without_a_window_or_a_limit_nothing_is_kept() -> None:
    state = window("off")
    for number in range(5):
        state.keep(unit(number))
        assert state.slide() is None
    assert not state.units
