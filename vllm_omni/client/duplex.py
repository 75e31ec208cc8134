"""A connection to the duplex lane (docs/realtime-api.md §13) that survives a dropped socket.

The session belongs to the server, not to the socket (§13.4): every session event carries a
`server_event_seq`, and a new socket can resume the session from the last one the client has,
after which the server replays what the client missed. This connection keeps what a resume
needs (session id, current resume token, last sequence number), delivers each numbered event
once, and acknowledges what it has delivered so the server can forget it.
"""

from __future__ import annotations

from typing import Any, cast

import websockets

from vllm_omni.client import events
from vllm_omni.client.connection import RealtimeConnection, connect
from vllm_omni.client.url import with_query
from vllm_omni.protocol.server_event_types import SESSION_CREATED, SESSION_RESUMED, SESSION_UPDATED

ACK_EVERY = 32


class DuplexError(RuntimeError):
    """The server refused to open or resume the session; `event` is what it sent (an `error`,
    or `session.resync_required`), after which it closes the socket (§13.1, §13.4)."""

    def __init__(self, event: dict[str, Any]):
        error = event.get("error")
        detail = f"{error.get('code')}: {error.get('message')}" if isinstance(error, dict) else event.get("type")
        super().__init__(detail)
        self.event = event


class DuplexConnection(RealtimeConnection):
    """`events` holds every delivered event once, numbered ones in `server_event_seq` order
    across resumes. Acknowledges with `session.event_ack` every `ack_every` numbered events
    (0: only when `ack()` is called)."""

    def __init__(self, ws: Any, url: str = "", headers: dict[str, str] | None = None):
        super().__init__(ws, url, headers)
        self.session_id: str | None = None
        self.capabilities: dict[str, Any] = {}  # session.created's (docs/realtime-api.md §2.6)
        self.resume_token: str | None = None
        self.attachment_generation = 0
        self.last_seq = 0  # the newest server_event_seq delivered
        self.acked_seq = 0
        self.duplicates = 0  # numbered events dropped because they had been delivered already
        self.ack_every = ACK_EVERY

    @classmethod
    async def start(cls, url: str, *, opening: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                    ack_every: int = ACK_EVERY, timeout: float = 30.0) -> DuplexConnection:
        """Open a session (§13.1): by autostart when `opening` is None (`url` must name the
        model), else with `opening`, a `session.update`, as the first message (`autostart=0`).
        Returns after `session.created` and its `session.updated`; raises DuplexError when
        the server refuses."""
        conn = cast(DuplexConnection, await cls.open(url if opening is None else with_query(url, autostart="0"),
                                                      headers, timeout))
        conn.ack_every = ack_every
        try:
            if opening is not None:
                await conn.send(opening)
            created = await conn._expect(SESSION_CREATED, timeout)
            conn.session_id = created["session"]["id"]
            conn.capabilities = created["session"].get("capabilities") or {}
            conn.resume_token, conn.attachment_generation = created["resume_token"], created["attachment_generation"]
            await conn._expect(SESSION_UPDATED, timeout)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _expect(self, kind: str, timeout: float) -> dict[str, Any]:
        event = await self.next(timeout)
        if event["type"] != kind:
            raise DuplexError(event)
        return event

    def _accept(self, event: dict[str, Any]) -> bool:
        """Numbered events are delivered once; the unnumbered ones (`session.created`,
        `session.resumed`, transport errors…, §13.4) always."""
        seq = event.get("server_event_seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            return True
        if seq <= self.last_seq:
            self.duplicates += 1
            return False
        self.last_seq = seq
        return True

    async def next(self, timeout: float = 60.0) -> dict[str, Any]:
        event = await super().next(timeout)
        if self.ack_every and self.last_seq - self.acked_seq >= self.ack_every:
            await self.ack()
        return event

    async def ack(self) -> None:
        """`session.event_ack` up to the newest delivered event: the server drops those from its
        replay journal. Best effort: on a dead socket the ack waits for the next one."""
        if self.last_seq <= self.acked_seq:
            return
        try:
            await self.send(events.event_ack(self.last_seq))
        except websockets.exceptions.ConnectionClosed:
            return
        self.acked_seq = self.last_seq

    async def resume(self, timeout: float = 30.0) -> dict[str, Any]:
        """Reattach to the session on a new socket (`?resume=1`, then `session.resume` with the
        last delivered number): returns `session.resumed` and keeps its rotated token. The
        events the server kept after that number follow, then the live stream. Events the
        old socket received but were not yet delivered are dropped: the replay has them.
        Raises DuplexError when the server refuses (the session expired, a stale token…)."""
        await self.close()
        self._attach(await connect(with_query(self.url, resume="1"), self.headers, timeout))
        try:
            await self.send(events.session_resume(self.session_id or "", self.resume_token or "", self.last_seq))
            resumed = await self._expect(SESSION_RESUMED, timeout)
        except BaseException:
            await self.close()
            raise
        self.resume_token, self.attachment_generation = resumed["resume_token"], resumed["attachment_generation"]
        return resumed
