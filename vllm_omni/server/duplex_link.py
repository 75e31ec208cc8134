"""One connection's hold on a duplex session (docs/realtime-api.md §13.1, §13.4): opening a
session (taking its slot), resuming one, and what the connection's end means for it.

The session belongs to the registry, not to the connection: when the socket goes away the
session is detached and runs on for its grace; `session.close` (or the maximum duration)
ends it; a resume from another socket replaces this one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_omni.protocol.duplex_view import duplex_view
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import session_replaced, session_resumed
from vllm_omni.protocol.server_events import error_event, new_id
from vllm_omni.server.duplex_handshake import Handshake, ResumeRequest
from vllm_omni.server.duplex_registry import DuplexEntry, DuplexRegistry
from vllm_omni.server.outbox import Outbox
from vllm_omni.server.slots import SessionSlots
from vllm_omni.session.factory import DuplexRoute
from vllm_omni.session.resume_journal import resume_error
from vllm_omni.session.session import Session


class DuplexLink:
    def __init__(self, registry: DuplexRegistry, slots: SessionSlots, outbox: Outbox,
                 on_detached: Callable[[], None]):
        self.registry, self.slots, self.outbox = registry, slots, outbox
        self._on_detached = on_detached  # the session left this connection: it closes
        self.entry: DuplexEntry | None = None
        self.replaced = False
        self.expiry: str | None = None  # why the session expired under this connection

    @property
    def session(self) -> Session:
        return self.entry.session

    def open(self, route: DuplexRoute, handshake: Handshake, model: str) -> None:
        """A new session with `handshake.opening`; raises ProtocolError (resource_exhausted, or
        the opening's problem)."""
        release = self.slots.take()
        if release is None:
            raise ProtocolError("resource_exhausted", f"duplex_session_capacity_exhausted: limit={self.slots.limit}")
        entry = self.registry.create(new_id("duplex-"), release)
        token = entry.credentials.issue()
        self.registry.attach(entry, self.outbox.put, self._replaced, self._expired)
        try:
            entry.session = route.open(handshake.opening, model, entry.emit, entry.session_id, {
                "attachment_generation": entry.credentials.attachment_generation, "resume_token": token})
        except BaseException:
            self.registry.discard(entry)
            raise
        self.entry = entry

    def resume(self, request: ResumeRequest) -> None:
        """Attach to a live session: session.resumed, the journal after the client's last seen
        event, then the live stream, with nothing in between (one synchronous step). Raises
        ResumeRefused for every failure of docs/realtime-api.md §13.4."""
        entry = self.registry.get(request.session_id)
        if entry is None or entry.session is None:
            raise resume_error("session_resume_expired", "no live session with that id (closed or expired)")
        if not entry.credentials.verify(request.resume_token):
            raise resume_error("invalid_resume_token", "the resume token is not this session's current one")
        replay = entry.journal.replay_after(request.last_received_server_event_seq)
        token = entry.credentials.resume(request.resume_token)
        self.outbox.put(session_resumed(session_id=entry.session_id, session=entry.session.session_object(),
                                        attachment_generation=entry.credentials.attachment_generation,
                                        resume_token=token))
        for event in replay:
            self.outbox.put(event)
        self.registry.attach(entry, self.outbox.put, self._replaced, self._expired)
        self.entry = entry

    def _replaced(self, generation: int) -> None:
        """Another connection resumed the session: this one is told, then closes."""
        self.replaced = True
        self.outbox.put(session_replaced(session_id=self.entry.session_id, attachment_generation=generation))
        self._on_detached()

    def _expired(self, reason: str) -> None:
        """The session's lease ran out (its session.expired is already queued)."""
        self.expiry = reason
        self._on_detached()

    @property
    def close_reason(self) -> str:
        """Why this connection's socket closes once the client or the session left it."""
        return "session_replaced" if self.replaced else self.expiry or "disconnect"

    def report(self, problem: ProtocolError, client_event_id: str | None = None) -> None:
        """An error of the transport class (a frame that did not decode, a bad ack): sent to this
        connection only, never journaled."""
        self.outbox.put(duplex_view(error_event(problem, client_event_id)))

    def acknowledge(self, raw: dict[str, Any]) -> None:
        """`session.event_ack`: the journal forgets what the client has."""
        try:
            self.entry.journal.ack(raw.get("server_event_seq"))
        except ProtocolError as problem:
            self.report(problem, raw.get("event_id") if isinstance(raw.get("event_id"), str) else None)

    async def end(self, reason: str) -> None:
        """The session ends for good (`session.close`, the maximum duration)."""
        if self.entry is not None:
            await self.registry.end(self.entry, reason)

    def connection_gone(self) -> None:
        """The socket ended without ending the session: it runs on, detached, for its grace."""
        if self.entry is not None and not self.replaced and self.expiry is None:
            self.registry.detach(self.entry, self.outbox.put)
