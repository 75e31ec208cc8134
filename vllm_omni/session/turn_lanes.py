"""A turn-mode connection's session before and after it picks its lane (docs/realtime-api.md §1.2).

The lane is chosen by the first `session.update` (a top-level string `model` and no `session`
object: legacy) or by the first event that is neither that nor an append (GA). Appends that
arrive before the choice are held and replayed into the chosen lane, in order. Until then the
connection speaks GA (its session.created was the GA session's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_omni.protocol.client_events import client_event_id
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.states import Lane
from vllm_omni.session.base import RealtimeSession

MAX_EARLY_APPEND_CHARS = 16 * 1024 * 1024  # base64 audio held while the lane is undecided


def selects_legacy(raw: dict[str, Any]) -> bool:
    return raw.get("type") == "session.update" and "session" not in raw and isinstance(raw.get("model"), str)


class TurnLanes:
    """Starts as the GA session; `legacy` builds the legacy one if the client asks for it."""

    def __init__(self, ga: RealtimeSession, legacy: Callable[[], RealtimeSession]):
        self._session = ga
        self._legacy = legacy
        self._chosen = False
        self._early: list[dict[str, Any]] = []
        self._early_chars = 0

    @property
    def lane(self) -> Lane | None:
        return self._session.lane if self._chosen else None

    @property
    def id(self) -> str:
        return self._session.id

    @property
    def idle_timeout_s(self) -> float:
        return self._session.idle_timeout_s

    def report(self, exc: ProtocolError, client_event_id: str | None = None) -> None:
        self._session.report(exc, client_event_id)

    async def handle(self, raw: dict[str, Any]) -> None:
        if not self._chosen:
            if raw.get("type") == "input_audio_buffer.append":
                self._hold(raw)
                return
            self._chosen = True
            if selects_legacy(raw):
                await self._session.close()
                self._session = self._legacy()
            early, self._early, self._early_chars = self._early, [], 0
            for held in early:
                await self._session.handle(held)
        await self._session.handle(raw)

    def _hold(self, raw: dict[str, Any]) -> None:
        size = len(str(raw.get("audio") or raw.get("delta") or ""))
        if self._early_chars + size > MAX_EARLY_APPEND_CHARS:
            self.report(ProtocolError("input_backpressure", "send session.update (or another event) before more "
                                      "audio"), client_event_id(raw))
            return
        self._early_chars += size
        self._early.append(raw)

    async def close(self) -> None:
        await self._session.close()
