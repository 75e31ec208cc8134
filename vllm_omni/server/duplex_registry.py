"""Duplex sessions outlive their connections (docs/realtime-api.md §13.4).

Each open duplex session has an entry here: its replay journal and resume credentials, the
connection it sends to now (`sink`; None while detached), and the slot it holds. A session
whose socket goes away keeps generating into its journal for `grace_s`; a `session.resume`
within that time attaches a new connection, otherwise the session expires and ends. A
session without activity (a client event other than `session.event_ack`, or an event of its
own) for `idle_ttl_s` loses its lease: it expires and its connection closes, however long
the client's own `idle_timeout_s` is (§1.9). The registry is process-local, as resume
credentials are; with several API frontends each claims its sessions in the engine host's
directory, and a resume that reaches another frontend is relayed here (server/duplex_relay.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_omni.protocol.server_event_builders import session_expired
from vllm_omni.server.frontend_identity import FrontendIdentity
from vllm_omni.session.base import Emit
from vllm_omni.session.resume_journal import ResumeCredentials, ResumeJournal
from vllm_omni.session.session import Session

logger = logging.getLogger(__name__)

DISCONNECT_GRACE_S = 30.0
IDLE_TTL_S = 300.0
REAPER_INTERVAL_S = 5.0  # how often leases are checked: expiry may lag the TTL by this much
STOP_TIMEOUT_S = 10.0


@dataclass(eq=False)
class DuplexEntry:
    session_id: str
    journal: ResumeJournal
    release: Callable[[], None]  # frees the session's slot
    credentials: ResumeCredentials = field(default_factory=ResumeCredentials)
    session: Session | None = None
    sink: Emit | None = None  # the attached connection's outbox
    replaced: Callable[[int], None] | None = None  # tells that connection it was replaced
    expired: Callable[[str], None] | None = None  # tells that connection the session expired (the reason)
    grace: asyncio.TimerHandle | None = None
    last_active: float = field(default_factory=time.monotonic)
    ended: bool = False

    def touch(self) -> None:
        """Activity: the lease starts over."""
        self.last_active = time.monotonic()

    def emit(self, event: dict[str, Any]) -> None:
        """The session's emit: journaled (and stamped), then sent if a connection is attached."""
        self.touch()
        for wire in self.journal.stamp(event):
            if self.sink is not None:
                self.sink(wire)


class DuplexRegistry:
    def __init__(self, grace_s: float = DISCONNECT_GRACE_S, idle_ttl_s: float | None = IDLE_TTL_S,
                 reaper_interval_s: float = REAPER_INTERVAL_S, frontend: FrontendIdentity | None = None):
        self.grace_s = grace_s
        self.frontend = frontend  # one of several API frontends: sessions are claimed in its directory
        self.idle_ttl_s = idle_ttl_s  # None: leases never expire
        self.reaper_interval_s = reaper_interval_s
        self._entries: dict[str, DuplexEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def create(self, session_id: str, release: Callable[[], None]) -> DuplexEntry:
        entry = DuplexEntry(session_id, ResumeJournal(session_id), release)
        self._entries[session_id] = entry
        if self.frontend is not None:
            self.frontend.directory.claim(session_id, self.frontend.address)
        return entry

    def get(self, session_id: str) -> DuplexEntry | None:
        entry = self._entries.get(session_id)
        return None if entry is None or entry.ended else entry

    def attach(self, entry: DuplexEntry, sink: Emit, replaced: Callable[[int], None],
               expired: Callable[[str], None]) -> None:
        """`sink` receives the session's events from now on; a connection still attached is told
        it was replaced (with its own generation)."""
        if entry.grace is not None:
            entry.grace.cancel()
            entry.grace = None
        if entry.replaced is not None:
            entry.replaced(entry.credentials.attachment_generation - 1)
        entry.sink, entry.replaced, entry.expired = sink, replaced, expired
        entry.touch()

    def detach(self, entry: DuplexEntry, sink: Emit) -> None:
        """The connection behind `sink` went away: the session runs on, journaling, until a
        resume or the end of its grace."""
        if entry.sink != sink or entry.ended:  # bound methods: equal, not identical
            return
        entry.sink = entry.replaced = entry.expired = None
        entry.grace = asyncio.get_running_loop().call_later(
            self.grace_s, lambda: asyncio.ensure_future(self.end(entry, "disconnect_grace_expired", expired=True)))

    def discard(self, entry: DuplexEntry) -> None:
        """An entry whose session never opened: gone, its slot free."""
        entry.ended = True
        self._remove(entry)
        entry.release()

    async def end(self, entry: DuplexEntry, reason: str, *, expired: bool = False) -> None:
        """The session ends (once): its work stops, its slot frees, its entry goes."""
        if entry.ended:
            return
        entry.ended = True
        if entry.grace is not None:
            entry.grace.cancel()
        if expired:
            entry.emit(session_expired(session_id=entry.session_id, reason=reason))
            if entry.expired is not None:
                entry.expired(reason)
        self._remove(entry)
        if entry.session is not None:
            try:
                await asyncio.wait_for(entry.session.close(), STOP_TIMEOUT_S)
            except Exception:
                logger.exception("stopping duplex session %s failed", entry.session_id)
        entry.release()

    def _remove(self, entry: DuplexEntry) -> None:
        self._entries.pop(entry.session_id, None)
        if self.frontend is not None:
            self.frontend.directory.release(entry.session_id)

    async def reap_idle(self) -> None:
        """Runs for the server's life: every `reaper_interval_s`, sessions whose lease ran out
        expire (detached ones are left to their grace)."""
        if self.idle_ttl_s is None:
            return
        while True:
            await asyncio.sleep(self.reaper_interval_s)
            deadline = time.monotonic() - self.idle_ttl_s
            for entry in [e for e in self._entries.values() if e.sink is not None and e.last_active < deadline]:
                await self.end(entry, "idle_ttl_expired", expired=True)

    async def close(self) -> None:
        """The server stops: every session ends."""
        for entry in list(self._entries.values()):
            await self.end(entry, "server_shutdown")
