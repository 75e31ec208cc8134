"""The duplex resume journal and resume credentials (docs/realtime-api.md §13), without a server."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.wire_text import EncodedEvent, compact_json
from vllm_omni.server.outbox import Outbox
from vllm_omni.session.resume_journal import (
    CLOSE_POLICY_VIOLATION,
    DEFAULT_REPLAY_MAX_BYTES,
    DEFAULT_REPLAY_TTL_S,
    UNJOURNALED_EVENT_TYPES,
    ResumeCredentials,
    ResumeJournal,
    ResumeRefused,
    wire_size,
)

SID = "duplex-test"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ev(kind: str = "response.output_audio.delta", **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": "event_x", **fields}


def stamp_one(journal: ResumeJournal, wire: dict[str, Any]) -> dict[str, Any]:
    [out] = journal.stamp(wire)
    return out


def make(clock: FakeClock | None = None, **kwargs: Any) -> ResumeJournal:
    return ResumeJournal(SID, clock=clock or FakeClock(), **kwargs)


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["server_event_seq"] for e in events]


def refused(excinfo: pytest.ExceptionInfo[ResumeRefused]) -> tuple[str, str]:
    """(event type, error code or resync reason) of a refusal."""
    wire = excinfo.value.event
    return wire["type"], wire["error"]["code"] if wire["type"] == "error" else wire["reason"]


# Stamping ------------------------------------------------------------------------------------

def test_defaults_follow_the_deploy_schema() -> None:
    journal = ResumeJournal(SID)
    assert (journal.ttl_s, journal.max_bytes) == (DEFAULT_REPLAY_TTL_S, DEFAULT_REPLAY_MAX_BYTES) == (60.0, 8388608)
    assert journal.head == 0 and len(journal) == 0 and journal.retained_bytes == 0


@pytest.mark.parametrize("kwargs", [{"ttl_s": 0}, {"max_bytes": 0}, {"ttl_s": -1.0}])
def test_bounds_must_be_positive(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ResumeJournal(SID, **kwargs)


def test_seq_starts_at_one_and_increases_strictly() -> None:
    journal = make()
    out = [stamp_one(journal, ev(delta=str(i))) for i in range(5)]
    assert seqs(out) == [1, 2, 3, 4, 5]
    assert journal.head == 5 and len(journal) == 5
    first = out[0]
    assert list(first)[:3] == ["type", "server_event_seq", "event_id"]
    assert first["delta"] == "0"


def test_stamping_copies_and_leaves_the_input_alone() -> None:
    journal = make()
    wire = ev()
    out = stamp_one(journal, wire)
    assert "server_event_seq" not in wire and out is not wire


@pytest.mark.parametrize("kind", sorted(UNJOURNALED_EVENT_TYPES))
def test_unjournaled_events_pass_through_untouched(kind: str) -> None:
    journal = make()
    stamp_one(journal, ev())
    wire = ev(kind, session_id=SID)
    assert journal.stamp(wire) == [wire] and journal.stamp(wire)[0] is wire
    assert "server_event_seq" not in wire
    assert journal.head == 1 and len(journal) == 1
    assert seqs([stamp_one(journal, ev())]) == [2]


def test_unjournaled_set_matches_the_spec() -> None:
    spec = {"session.created", "session.resumed", "session.replaced", "session.resync_required"}
    assert spec == UNJOURNALED_EVENT_TYPES


def test_session_errors_are_journaled() -> None:
    journal = make()
    out = stamp_one(journal, ev("error", error={"code": "input_audio_buffer_empty"}))
    assert out["server_event_seq"] == 1 and len(journal) == 1


def test_double_stamp_is_a_bug() -> None:
    journal = make()
    out = stamp_one(journal, ev())
    with pytest.raises(ValueError):
        journal.stamp(out)
    assert journal.head == 1


def test_size_is_compact_utf8_json_of_the_stamped_event() -> None:
    journal = make()
    out = [stamp_one(journal, ev("response.output_audio_transcript.delta", delta="你好，我")),
           stamp_one(journal, ev(nested={"a": [1, 2]}))]
    expected = sum(len(json.dumps(o, ensure_ascii=False, separators=(",", ":")).encode()) for o in out)
    assert journal.retained_bytes == expected == sum(wire_size(o) for o in out)
    assert wire_size({"type": "x", "d": "é"}) == len('{"type":"x","d":"é"}'.encode()) == 21


# Acknowledgement -----------------------------------------------------------------------------

def test_ack_trims_entries_up_to_n() -> None:
    journal = make()
    out = [stamp_one(journal, ev(delta=str(i))) for i in range(5)]
    journal.ack(3)
    assert len(journal) == 2 and journal.retained_bytes == sum(wire_size(o) for o in out[3:])
    assert journal.replay_after(3) == out[3:]
    journal.ack(3)  # repeated ack: no-op
    journal.ack(1)  # older ack: no-op
    assert len(journal) == 2
    journal.ack(5)
    assert len(journal) == 0 and journal.retained_bytes == 0
    assert journal.replay_after(5) == []


def test_ack_zero_and_ack_of_head_are_valid() -> None:
    journal = make()
    journal.ack(0)
    stamp_one(journal, ev())
    journal.ack(0)
    assert len(journal) == 1
    journal.ack(journal.head)
    assert len(journal) == 0


@pytest.mark.parametrize("bad", [-1, 3, 1.0, 1.5, "1", None, True, False, [1], {"n": 1}])
def test_invalid_ack_is_a_non_fatal_error(bad: object) -> None:
    journal = make()
    stamp_one(journal, ev())
    stamp_one(journal, ev())
    with pytest.raises(ProtocolError) as excinfo:
        journal.ack(bad)
    error = excinfo.value
    assert (error.code, error.fatal, error.param) == ("invalid_event_ack", False, "server_event_seq")
    assert len(journal) == 2 and journal.head == 2


def test_ack_before_any_event_rejects_positive_seq() -> None:
    with pytest.raises(ProtocolError, match="newer"):
        make().ack(1)


# Age ---------------------------------------------------------------------------------------

def test_entries_older_than_the_ttl_are_pruned() -> None:
    clock = FakeClock()
    journal = make(clock, ttl_s=60.0)
    stamp_one(journal, ev())  # seq 1 at t0
    clock.now += 30
    stamp_one(journal, ev())  # seq 2 at t0+30
    clock.now += 30  # seq 1 is exactly ttl old: kept
    assert seqs(journal.replay_after(0)) == [1, 2]
    clock.now += 0.5
    assert seqs(journal.replay_after(1)) == [2]
    assert len(journal) == 1
    with pytest.raises(ResumeRefused) as excinfo:  # seq 1 is gone
        journal.replay_after(0)
    assert refused(excinfo) == ("session.resync_required", "journal_gap")


def test_stamping_prunes_and_frees_bytes() -> None:
    clock = FakeClock()
    journal = make(clock, ttl_s=1.0)
    stamp_one(journal, ev(delta="x" * 100))
    clock.now += 2
    latest = stamp_one(journal, ev())
    assert len(journal) == 1 and journal.retained_bytes == wire_size(latest)


def test_ttl_pruning_makes_room_before_the_overflow_check() -> None:
    clock = FakeClock()
    big = ev(delta="x" * 200)
    size = wire_size({"server_event_seq": 1, **big})
    journal = make(clock, ttl_s=1.0, max_bytes=size + 10)
    stamp_one(journal, big)
    clock.now += 2
    out = journal.stamp(ev(delta="y" * 200))
    assert seqs(out) == [2] and not journal.overflowed


# Overflow ----------------------------------------------------------------------------------

def test_overflow_emits_one_resync_and_stops_stamping() -> None:
    journal = make(max_bytes=300)
    first = stamp_one(journal, ev(delta="a" * 100))
    assert first["server_event_seq"] == 1
    trigger = ev(delta="b" * 200)
    out = journal.stamp(trigger)
    assert len(out) == 2
    notice, sent = out
    assert {k: notice[k] for k in ("type", "session_id", "reason")} == {
        "type": "session.resync_required", "session_id": SID, "reason": "journal_overflow"}
    assert notice["event_id"].startswith("event_") and "server_event_seq" not in notice
    assert sent is trigger and "server_event_seq" not in sent
    assert journal.overflowed and journal.head == 1
    assert len(journal) == 0 and journal.retained_bytes == 0
    later = [journal.stamp(ev(delta="c")) for _ in range(3)]
    assert all(len(o) == 1 and "server_event_seq" not in o[0] for o in later)
    assert journal.head == 1 and len(journal) == 0


def test_overflow_fails_every_later_resume() -> None:
    journal = make(max_bytes=100)
    stamp_one(journal, ev())
    journal.stamp(ev(delta="x" * 200))
    for n in (0, 1):
        with pytest.raises(ResumeRefused) as excinfo:
            journal.replay_after(n)
        assert refused(excinfo) == ("session.resync_required", "journal_gap")
    journal.ack(1)  # acks up to the last stamped seq stay valid
    with pytest.raises(ProtocolError):
        journal.ack(2)


def test_one_event_larger_than_the_cap_overflows_at_once() -> None:
    journal = make(max_bytes=50)
    out = journal.stamp(ev(delta="x" * 100))
    assert [o["type"] for o in out] == ["session.resync_required", "response.output_audio.delta"]
    assert journal.head == 0


def test_exactly_full_journal_does_not_overflow() -> None:
    wire = ev()
    journal = make(max_bytes=wire_size({"server_event_seq": 1, **wire}))
    assert seqs(journal.stamp(wire)) == [1]
    assert journal.retained_bytes == journal.max_bytes and not journal.overflowed


def test_entry_count_is_bounded_by_bytes() -> None:
    journal = make(max_bytes=1000)
    smallest = wire_size({"type": "x", "server_event_seq": 1})
    most = 0
    for _ in range(1000):
        journal.stamp({"type": "x"})
        most = max(most, len(journal))
    assert journal.overflowed and len(journal) == 0
    assert 0 < most <= 1000 // smallest and journal.head == most


# Replay ------------------------------------------------------------------------------------

def test_replay_after_n_returns_the_later_events_in_order() -> None:
    journal = make()
    out = [stamp_one(journal, ev(delta=str(i))) for i in range(4)]
    assert journal.replay_after(0) == out
    assert journal.replay_after(2) == out[2:]
    assert journal.replay_after(4) == []  # n == head
    assert len(journal) == 4  # replay does not trim


def test_replay_on_a_fresh_journal() -> None:
    journal = make()
    assert journal.replay_after(0) == []
    with pytest.raises(ResumeRefused) as excinfo:
        journal.replay_after(1)
    assert refused(excinfo) == ("error", "session_resume_conflict")


def test_replay_after_an_acked_seq_is_a_gap() -> None:
    journal = make()
    for _ in range(4):
        stamp_one(journal, ev())
    journal.ack(2)
    assert seqs(journal.replay_after(2)) == [3, 4]
    with pytest.raises(ResumeRefused) as excinfo:
        journal.replay_after(1)
    assert refused(excinfo) == ("session.resync_required", "journal_gap")
    refusal = excinfo.value
    assert refusal.event["session_id"] == SID and "server_event_seq" not in refusal.event
    assert (refusal.close_code, refusal.close_reason) == (CLOSE_POLICY_VIOLATION, "journal_gap") == (1008,
                                                                                                     "journal_gap")


def test_replay_after_a_seq_newer_than_the_head_is_a_conflict() -> None:
    journal = make()
    stamp_one(journal, ev())
    with pytest.raises(ResumeRefused) as excinfo:
        journal.replay_after(2)
    assert refused(excinfo) == ("error", "session_resume_conflict")
    refusal = excinfo.value
    assert refusal.event["error"]["type"] == "invalid_request_error"
    assert (refusal.close_code, refusal.close_reason) == (1008, "session_resume_conflict")


@pytest.mark.parametrize("bad", [-1, 1.0, "0", None, True])
def test_malformed_last_received_seq(bad: object) -> None:
    journal = make()
    stamp_one(journal, ev())
    with pytest.raises(ResumeRefused) as excinfo:
        journal.replay_after(bad)
    assert refused(excinfo) == ("error", "invalid_session_resume")


def test_journaling_continues_after_a_replay() -> None:
    journal = make()
    stamp_one(journal, ev())
    journal.replay_after(0)
    assert seqs([stamp_one(journal, ev())]) == [2]
    assert seqs(journal.replay_after(1)) == [2]


# Credentials ---------------------------------------------------------------------------------

def test_issued_token_shape_and_only_its_hash_is_kept() -> None:
    credentials = ResumeCredentials()
    token = credentials.issue()
    assert len(token) == 43 and all(c.isalnum() or c in "-_" for c in token)
    assert credentials.attachment_generation == 1
    assert credentials.verify(token)
    stored = [v for v in vars(credentials).values() if isinstance(v, (str, bytes))]
    assert stored == [hashlib.sha256(token.encode()).digest()]


def test_tokens_are_fresh() -> None:
    assert len({ResumeCredentials().issue() for _ in range(20)}) == 20


@pytest.mark.parametrize("wrong", ["", "not-the-token", None, 123, b"bytes"])
def test_wrong_token_does_not_verify(wrong: object) -> None:
    credentials = ResumeCredentials()
    credentials.issue()
    assert not credentials.verify(wrong)
    with pytest.raises(ResumeRefused) as excinfo:
        credentials.resume(wrong)
    assert refused(excinfo) == ("error", "invalid_resume_token")
    assert excinfo.value.close_code == 1008 and excinfo.value.close_reason == "invalid_resume_token"
    assert credentials.attachment_generation == 1


def test_nothing_verifies_before_issue() -> None:
    assert not ResumeCredentials().verify("anything")


def test_resume_rotates_the_token_and_bumps_the_generation() -> None:
    credentials = ResumeCredentials()
    first = credentials.issue()
    second = credentials.resume(first)
    assert second != first and credentials.attachment_generation == 2
    assert credentials.verify(second) and not credentials.verify(first)
    with pytest.raises(ResumeRefused) as excinfo:
        credentials.resume(first)  # rotated away
    assert refused(excinfo) == ("error", "invalid_resume_token")
    third = credentials.resume(second)
    assert credentials.attachment_generation == 3 and credentials.verify(third)
    assert not credentials.verify(second)


async def test_a_journaled_event_is_encoded_once_and_the_socket_sends_that_text() -> None:
    """The journal sizes an event by its compact JSON; the connection's writer sends that same
    text instead of encoding the event again (protocol/wire_text.py)."""
    journal = ResumeJournal("s")
    [out] = journal.stamp(ev("response.output_audio_transcript.delta", delta="你好"))
    assert isinstance(out, EncodedEvent) and json.loads(out.text) == out
    assert journal.retained_bytes == len(out.text.encode())

    class Socket:
        sent: list[str] = []

        async def send_text(self, text: str) -> None:
            self.sent.append(text)

    socket = Socket()
    outbox = Outbox(socket, send_timeout_s=5)  # type: ignore[arg-type]
    out.text = '{"type":"marker"}'  # what the writer sends is the carried text, not a new encoding
    outbox.put(out)
    outbox.put(ev("response.done"))  # a plain dict is encoded on the way out
    await outbox.flush_and_stop()
    assert socket.sent == ['{"type":"marker"}', compact_json(ev("response.done"))]
