"""The server's session slots (`max_sessions`): taken at admission, released exactly once when
the session ends, whichever connection it ends on (a duplex session may outlive several). An
HTTP generation request holds one while it is answered."""

from __future__ import annotations

from collections.abc import Callable

from vllm_omni.metrics import prometheus as metrics


class SessionSlots:
    def __init__(self, limit: int):
        self.limit = limit
        self.open = 0  # one event loop: a plain counter is enough

    def take(self, realtime: bool = True) -> Callable[[], None] | None:
        """A slot's release (safe to call twice), or None when all are taken. Only `realtime`
        slots count in the realtime sessions' metrics (an HTTP request has its own)."""
        if self.open >= self.limit:
            return None
        self.open += 1
        if realtime:
            metrics.ACTIVE_SESSIONS.inc()
            metrics.SESSIONS_TOTAL.inc()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open -= 1
                if realtime:
                    metrics.ACTIVE_SESSIONS.dec()

        return release
