"""A duplex session's context window (docs/minicpmo.md, "Context windows").

The window remembers what the context holds, as runs: the system turn, split where the
dropped units' text goes in `context` mode, and each unit since. When the context outgrows
the window, the oldest whole units go and the loop re-prefills the rest as a new context,
so the kept units take new positions from the system turn on (the official loop re-indexes
its cached keys instead; a backend that cannot edit its cache — vLLM — can only re-prefill,
and both backends do the same so they stay equal).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import torch

from vllm_omni.models.minicpmo.opening_settings import ContextWindow

PREVIOUS_MARKER = "\n\nprevious: "  # before the dropped units' text, inside the system turn


@dataclass(frozen=True)
class Rows:
    """A run of embedding rows in the context."""

    rows: torch.Tensor  # [n, hidden]
    modality: Literal["audio", "image"]
    label: str  # its schema entry, e.g. "[audio×10]"


Run = list[int] | Rows


def runs_length(runs: list[Run]) -> int:
    return sum(run.rows.shape[0] if isinstance(run, Rows) else len(run) for run in runs)


@dataclass
class KeptUnit:
    runs: list[Run]
    text_tokens: list[int]  # what the model said in it (kept in `context` mode when it goes)

    @property
    def length(self) -> int:
        return runs_length(self.runs)


@dataclass
class WindowState:
    """The runs a re-prefill needs. `limit`: the most positions the backend holds (None: no
    limit); a unit is never allowed to start within `unit_headroom` of it."""

    window: ContextWindow
    system_prefix: list[Run]  # the system turn up to where the previous text goes
    system_suffix: list[Run]  # the rest of it (and a text-seeded user turn)
    previous_marker: list[int]  # PREVIOUS_MARKER's token ids
    limit: int | None = None
    unit_headroom: int = 0
    units: deque[KeptUnit] = field(default_factory=deque)
    previous: list[int] = field(default_factory=list)  # `context`: the dropped units' text, newest last
    slides: int = 0  # times the context was rebuilt

    def keep(self, unit: KeptUnit) -> None:
        """Remember a closed unit, unless nothing can ever slide (no window, no limit)."""
        if self.window.mode != "off" or self.limit is not None:
            self.units.append(unit)

    def slide(self) -> list[Run] | None:
        """The runs of the new, smaller context, when the context outgrew the window; else None."""
        dropped: list[KeptUnit] = []
        if self.window.mode == "context":
            while len(self.units) > self.window.max_units:
                dropped.append(self.units.popleft())
        high, low = self._marks()
        kept = self._system_length() + sum(unit.length for unit in self.units)
        if high is not None and kept > high:
            while self.units and kept > low:
                unit = self.units.popleft()
                kept -= unit.length
                dropped.append(unit)
        if not dropped:
            return None
        if self.window.mode == "context":
            said = [token for unit in dropped for token in unit.text_tokens]
            self.previous = [*self.previous, *said][-self.window.previous_max_tokens:]
        self.slides += 1
        return [*self._system(), *(run for unit in self.units for run in unit.runs)]

    def _marks(self) -> tuple[int | None, int]:
        """(high, low) in positions: the window's, or the backend limit's if that is smaller."""
        high = self.window.high_tokens if self.window.mode == "basic" else None
        if self.limit is not None:
            ceiling = self.limit - self.unit_headroom
            if high is None or ceiling < high:
                return ceiling, min(self.window.low_tokens, ceiling * 3 // 4)
        return high, self.window.low_tokens

    def _system(self) -> list[Run]:
        previous = [[*self.previous_marker, *self.previous]] if self.previous else []
        return [*self.system_prefix, *previous, *self.system_suffix]

    def _system_length(self) -> int:
        return runs_length(self._system())
