"""Playback-deadline scheduling: which spoken answers may yield their stage steps.

Every request that streams audio has a *lead*: the seconds of audio already delivered to
its listener minus the seconds since its first chunk, i.e. how long until the listener
would hear a gap. A request that wants audio and has none yet has no lead at all: its
listener is waiting in silence. Such a request, or one whose lead has fallen below
`urgent_lead_s`, is *urgent*. While anything is urgent, answers more than `yield_lead_s`
ahead sit out the stage steps (vLLM schedulers, torch step workers), so the urgent work
runs in small batches and a new turn's first audio does not wait behind answers that are
seconds ahead. Nothing starves: a yielding answer's lead shrinks in real time and it runs
again once it is down to `yield_lead_s`, urgent work or not. With no urgent work every
request runs; no answer is ever held for being ahead alone, so nothing gets slower when
the machine has room.

Holding changes when a request's steps run, never what they compute, so outputs are
unchanged. Leads are computed from `time.monotonic()`, which every process on one host
shares, so a snapshot taken here is valid in an engine's own processes too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vllm_omni.config import PlaybackPacing


@dataclass(frozen=True)
class PaceSnapshot:
    """The pacing state at one moment: for each audio request, the monotonic time of its
    first chunk (None before it) and the seconds of audio delivered since."""

    policy: PlaybackPacing
    playback: dict[str, tuple[float | None, float]] = field(default_factory=dict)

    def to_wire(self) -> tuple[dict[str, Any], list[list[Any]]]:
        """Plain values for an RPC to an engine's processes (`from_wire` reads them)."""
        return self.policy.model_dump(), [[r, started, delivered] for r, (started, delivered) in self.playback.items()]

    @classmethod
    def from_wire(cls, policy: dict[str, Any], playback: list[list[Any]]) -> PaceSnapshot:
        return cls(PlaybackPacing.model_validate(policy),
                   {request_id: (started, delivered) for request_id, started, delivered in playback})

    def lead_s(self, request_id: str, now: float) -> float | None:
        """Seconds of delivered audio not yet played; None before the first chunk (and for
        requests without audio, which are never held)."""
        started, delivered = self.playback.get(request_id, (None, 0.0))
        return None if started is None else delivered - (now - started)

    def urgent(self, now: float) -> bool:
        """Whether some listener is waiting for first audio or about to hear a gap."""
        for request_id in self.playback:
            lead = self.lead_s(request_id, now)
            if lead is None or lead < self.policy.urgent_lead_s:
                return True
        return False

    def yielding(self, request_ids: Iterable[str], now: float | None = None) -> set[str]:
        """Those of `request_ids` that sit out the next step."""
        if not self.policy.enabled or not self.playback:
            return set()
        now = time.monotonic() if now is None else now
        if not self.urgent(now):
            return set()
        return {r for r in request_ids if (lead := self.lead_s(r, now)) is not None and lead > self.policy.yield_lead_s}

    def next_change_s(self, request_ids: Iterable[str], now: float) -> float | None:
        """Seconds until the first of `request_ids` stops yielding by its lead alone."""
        waits = [lead - self.policy.yield_lead_s for r in request_ids
                 if (lead := self.lead_s(r, now)) is not None]
        return max(0.0, min(waits)) if waits else None

    def order(self, request_ids: list[str], now: float) -> list[str]:
        """Nearest deadline first: requests waiting for first audio, then by lead; requests
        without audio keep their place among the first."""
        def deadline(request_id: str) -> float:
            lead = self.lead_s(request_id, now)
            return float("-inf") if lead is None else lead

        return sorted(request_ids, key=deadline)


class PlaybackPacer:
    """The engine's live pacing state; `listeners` get each new snapshot (stages that
    schedule in other processes)."""

    def __init__(self, policy: PlaybackPacing):
        self._lock = threading.Lock()
        self._snapshot = PaceSnapshot(policy)
        self.listeners: list[Callable[[PaceSnapshot], None]] = []

    @property
    def snapshot(self) -> PaceSnapshot:
        return self._snapshot

    def add(self, request_id: str) -> None:
        """A request that will speak: urgent until its first audio."""
        self._update(request_id, lambda _: (None, 0.0))

    def delivered(self, request_id: str, seconds: float) -> None:
        """`seconds` more audio of `request_id` went to its listener."""
        def more(known: tuple[float | None, float] | None) -> tuple[float | None, float]:
            started, total = known or (None, 0.0)
            return time.monotonic() if started is None else started, total + seconds

        self._update(request_id, more)

    def forget(self, request_id: str) -> None:
        self._update(request_id, lambda _: None)

    def _update(self, request_id: str, change: Callable[[Any], tuple[float | None, float] | None]) -> None:
        """Replace the snapshot with `request_id`'s entry changed (None: removed) and tell the
        listeners, in the order of the changes."""
        with self._lock:
            playback = dict(self._snapshot.playback)
            value = change(playback.get(request_id))
            if value is None and request_id not in playback:
                return
            if value is None:
                del playback[request_id]
            else:
                playback[request_id] = value
            self._snapshot = PaceSnapshot(self._snapshot.policy, playback)
            for listener in self.listeners:
                listener(self._snapshot)
