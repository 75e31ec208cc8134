"""Resume state of a duplex session: the replay journal and the rotating resume token.

Wire behaviour: docs/realtime-api.md §13.4 (resume, replay and `session.event_ack`).

* `ResumeJournal` stamps `server_event_seq` on the events the session sends, keeps them for
  replay after a `session.resume`, trims them on `session.event_ack`, and prunes them by age
  (`resume_replay_ttl_s`) and size (`resume_replay_max_bytes_per_session`, compact JSON, encoded
  once: protocol/wire_text.py).
* `ResumeCredentials` holds the SHA-256 of the current resume token and the attachment
  generation; each successful resume rotates the token.

Both are plain in-process objects driven by one event loop; the server owns the socket,
the session registry and the close handshake.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_events import error_event, event
from vllm_omni.protocol.wire_text import EncodedEvent, wire_text

Wire = dict[str, Any]

SESSION_RESYNC_REQUIRED = "session.resync_required"

# Never stamped nor journaled (docs/realtime-api.md §13.4). Besides these types, errors raised
# while a client event is parsed or validated before it reaches the session (transport class,
# e.g. `invalid_json`, `bad_event`, `unknown_event`, `invalid_event_ack`) are not journaled
# either: they share the `error` type with journaled session errors, so the caller simply
# does not pass them to `ResumeJournal.stamp`.
UNJOURNALED_EVENT_TYPES = frozenset({
    "session.created", "session.resumed", "session.replaced", SESSION_RESYNC_REQUIRED,
})

DEFAULT_REPLAY_TTL_S = 60.0  # duplex_session.resume_replay_ttl_s
DEFAULT_REPLAY_MAX_BYTES = 8_388_608  # duplex_session.resume_replay_max_bytes_per_session

# Fatal client-caused handshake errors close with 1008 and the failure as the reason.
CLOSE_POLICY_VIOLATION = 1008

JOURNAL_GAP = "journal_gap"
JOURNAL_OVERFLOW = "journal_overflow"


def resync_required(session_id: str, reason: str) -> Wire:
    """`session.resync_required`; `reason` is `journal_gap` or `journal_overflow`."""
    return event(SESSION_RESYNC_REQUIRED, session_id=session_id, reason=reason)


def wire_size(wire: Wire) -> int:
    """Bytes of the compact UTF-8 JSON the outbox sends for `wire`."""
    return len(wire_text(wire).encode())


def _is_seq(value: object) -> bool:
    """A non-negative JSON integer (`true` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class ResumeRefused(Exception):
    """A `session.resume` that fails. Every resume failure ends the connection: the server
    sends `event` (an `error`, or `session.resync_required` for a journal gap) and then closes
    the socket with `close_code` and `close_reason`."""

    def __init__(self, event: Wire, close_reason: str, close_code: int = CLOSE_POLICY_VIOLATION):
        super().__init__(close_reason)
        self.event, self.close_reason, self.close_code = event, close_reason, close_code


def resume_error(code: str, message: str) -> ResumeRefused:
    """A resume failure reported as an `error` event with `code` (e.g. `session_resume_expired`)."""
    return ResumeRefused(error_event(ProtocolError(code, message, fatal=True)), close_reason=code)


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    wire: Wire
    size: int
    at: float  # clock reading when journaled


class ResumeJournal:
    """The replay journal of one session.

    Memory is bounded by `max_bytes` of compact JSON and by `ttl_s` of age; the number of
    entries is bounded too, as no stamped event is smaller than ~33 bytes. Once the bytes would
    exceed `max_bytes` the journal overflows for good: it returns one
    `session.resync_required{reason:"journal_overflow"}`, drops what it holds, and events go
    out unstamped from then on, so every later resume fails with a journal gap.
    """

    def __init__(self, session_id: str, *, ttl_s: float = DEFAULT_REPLAY_TTL_S,
                 max_bytes: int = DEFAULT_REPLAY_MAX_BYTES, clock: Callable[[], float] = time.monotonic):
        if ttl_s <= 0 or max_bytes <= 0:
            raise ValueError("ttl_s and max_bytes must be > 0")
        self.session_id = session_id
        self.ttl_s, self.max_bytes, self._clock = ttl_s, max_bytes, clock
        self._entries: deque[_Entry] = deque()
        self._bytes = 0
        self._head = 0  # latest seq handed out
        self._floor = 0  # every seq <= floor has left the journal (acked or pruned)
        self._overflowed = False

    @property
    def head(self) -> int:
        """The latest `server_event_seq` sent (0 before the first)."""
        return self._head

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    @property
    def overflowed(self) -> bool:
        return self._overflowed

    def __len__(self) -> int:
        return len(self._entries)

    def stamp(self, wire: Wire) -> list[Wire]:
        """The events to send for `wire`, in order.

        Normally `[wire + server_event_seq]`, journaled, as an `EncodedEvent`: the text the
        journal was sized by is the text the outbox sends. Types in `UNJOURNALED_EVENT_TYPES` and
        every event after an overflow come back unchanged. The event that overflows the journal
        comes back unstamped after the one `session.resync_required`. The journal keeps the
        returned dict, so do not mutate it afterwards.
        """
        if wire["type"] in UNJOURNALED_EVENT_TYPES or self._overflowed:
            return [wire]
        if "server_event_seq" in wire:
            raise ValueError(f"{wire['type']} is already stamped")
        now = self._clock()
        self._prune(now)
        stamped = EncodedEvent({"type": wire["type"], "server_event_seq": self._head + 1, **wire})
        size = wire_size(stamped)
        if self._bytes + size > self.max_bytes:
            self._overflow()
            return [resync_required(self.session_id, JOURNAL_OVERFLOW), wire]
        self._head += 1
        self._entries.append(_Entry(self._head, stamped, size, now))
        self._bytes += size
        return [stamped]

    def ack(self, seq: object) -> None:
        """Apply `session.event_ack{server_event_seq: seq}`: drop the entries <= seq.

        Raises the non-fatal `invalid_event_ack` unless seq is an integer in [0, head].
        """
        if not _is_seq(seq):
            raise ProtocolError("invalid_event_ack", "server_event_seq must be a non-negative integer",
                                param="server_event_seq")
        if seq > self._head:
            raise ProtocolError("invalid_event_ack",
                                f"server_event_seq {seq} is newer than the latest sent ({self._head})",
                                param="server_event_seq")
        while self._entries and self._entries[0].seq <= seq:
            self._drop_oldest()
        self._floor = max(self._floor, seq)

    def replay_after(self, last_received: object) -> list[Wire]:
        """The journaled events with `server_event_seq > last_received`, oldest first, for a
        `session.resume` carrying `last_received_server_event_seq`.

        Raises `ResumeRefused`: `invalid_session_resume` for a malformed value,
        `session_resume_conflict` when it is newer than the head, and a
        `session.resync_required{reason:"journal_gap"}` when events after it are no longer
        retained or the journal has overflowed.
        """
        if not _is_seq(last_received):
            raise resume_error("invalid_session_resume",
                               "last_received_server_event_seq must be a non-negative integer")
        if last_received > self._head:
            raise resume_error("session_resume_conflict",
                               f"last_received_server_event_seq {last_received} is newer than the latest "
                               f"server_event_seq ({self._head})")
        self._prune(self._clock())
        if self._overflowed or last_received < self._floor:
            raise ResumeRefused(resync_required(self.session_id, JOURNAL_GAP), close_reason=JOURNAL_GAP)
        return [entry.wire for entry in self._entries if entry.seq > last_received]

    def _prune(self, now: float) -> None:
        while self._entries and now - self._entries[0].at > self.ttl_s:
            self._floor = self._entries[0].seq
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        self._bytes -= self._entries.popleft().size

    def _overflow(self) -> None:
        self._overflowed = True
        self._entries.clear()
        self._bytes = 0
        self._floor = self._head


class ResumeCredentials:
    """The resume token and attachment generation of one resumable session.

    Only the SHA-256 of the current token is kept. `issue()` gives the token for
    `session.created` (generation 1); each successful `resume()` bumps the generation and
    rotates the token, so an earlier token stops working.
    """

    def __init__(self) -> None:
        self.attachment_generation = 1
        self._digest: bytes | None = None

    def issue(self) -> str:
        """A fresh token (43 URL-safe chars from 32 random bytes); it replaces the previous one."""
        token = secrets.token_urlsafe(32)
        self._digest = _digest(token)
        return token

    def verify(self, token: object) -> bool:
        """Whether `token` is the current one (constant-time comparison of the digests)."""
        if self._digest is None or not isinstance(token, str):
            return False
        return hmac.compare_digest(_digest(token), self._digest)

    def resume(self, token: object) -> str:
        """Accept a resume with `token`: returns the rotated token for `session.resumed`.

        Raises `ResumeRefused` (`invalid_resume_token`) for a wrong or superseded token.
        """
        if not self.verify(token):
            raise resume_error("invalid_resume_token", "resume_token is not valid for this session")
        self.attachment_generation += 1
        return self.issue()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
