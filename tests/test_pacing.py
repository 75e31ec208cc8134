"""Playback-deadline scheduling (engine/pacing.py): who yields, who goes first, and that a
torch step worker follows it."""

from __future__ import annotations

import threading
import time

import pytest

from vllm_omni.config import PlaybackPacing
from vllm_omni.engine.backends.step_worker import StageWorker
from vllm_omni.engine.pacing import PaceSnapshot, PlaybackPacer

POLICY = PlaybackPacing(urgent_lead_s=0.5, yield_lead_s=1.0)
NOW = 100.0


def snapshot(**playback: tuple[float | None, float]) -> PaceSnapshot:
    return PaceSnapshot(POLICY, dict(playback))


def test_answers_far_ahead_yield_only_while_a_listener_waits() -> None:
    # "ahead" started 2 s ago with 10 s delivered: 8 s ahead; "close" 0.8 s ahead
    ahead, close = (NOW - 2.0, 10.0), (NOW - 2.0, 2.8)
    assert snapshot(ahead=ahead, close=close).yielding(["ahead", "close"], NOW) == set()
    waiting = snapshot(ahead=ahead, close=close, new=(None, 0.0))
    assert waiting.yielding(["ahead", "close", "new", "text-only"], NOW) == {"ahead"}
    about_to_stall = snapshot(ahead=ahead, short=(NOW - 2.0, 2.2))  # 0.2 s left: urgent
    assert about_to_stall.yielding(["ahead", "short"], NOW) == {"ahead"}
    # nothing starves: once its lead is down to yield_lead_s, it runs again
    assert waiting.yielding(["ahead"], NOW + 7.0) == set()
    assert waiting.next_change_s(["ahead"], NOW) == 7.0


def test_pacing_off_holds_nothing() -> None:
    off = PaceSnapshot(PlaybackPacing(enabled=False), {"ahead": (NOW - 2.0, 10.0), "new": (None, 0.0)})
    assert off.yielding(["ahead", "new"], NOW) == set()


def test_nearest_deadline_first() -> None:
    state = snapshot(far=(NOW - 1.0, 9.0), near=(NOW - 1.0, 1.5), new=(None, 0.0))
    assert state.order(["far", "near", "text-only", "new"], NOW) == ["text-only", "new", "near", "far"]


def test_the_pacer_tracks_delivery_and_tells_its_listeners() -> None:
    pacer = PlaybackPacer(POLICY)
    seen: list[PaceSnapshot] = []
    pacer.listeners.append(seen.append)
    pacer.add("a")
    assert pacer.snapshot.lead_s("a", NOW) is None
    before = time.monotonic()
    pacer.delivered("a", 2.0)
    pacer.delivered("a", 1.0)
    started, delivered = pacer.snapshot.playback["a"]
    # playback starts at the first delivery; the lead is delivered audio minus the time since
    assert delivered == 3.0 and before <= started <= time.monotonic()
    assert pacer.snapshot.lead_s("a", started) == 3.0
    assert pacer.snapshot.lead_s("a", started + 0.5) == pytest.approx(2.5)
    pacer.forget("a")
    assert pacer.snapshot.playback == {} and len(seen) == 4
    assert PaceSnapshot.from_wire(*seen[2].to_wire()) == seen[2]


class _Steps:
    """A stage program whose requests always have another step; records the order."""

    def __init__(self, ids: list[str]):
        self.ids, self.stepped = ids, []
        self.done = threading.Event()

    def accept(self, request_id, message): ...
    def drop(self, request_id): ...
    def request_ids(self): return list(self.ids)
    def runnable(self): return list(self.ids)

    def step(self, request_id, emit):
        self.stepped.append(request_id)
        if len(self.stepped) >= 30:
            self.done.set()
            time.sleep(0.01)


def test_a_step_worker_serves_the_waiting_listener_and_lets_the_answer_ahead_yield() -> None:
    program = _Steps(["ahead", "new"])
    worker = StageWorker("code2wav", program, lambda *a: None, lambda *a: None, max_active=8)
    now = time.monotonic()
    worker.update_pace(PaceSnapshot(POLICY, {"ahead": (now, 30.0), "new": (None, 0.0)}))
    worker.start()
    assert program.done.wait(10)
    worker.stop()
    assert set(program.stepped[:30]) == {"new"}


def test_no_yielding_while_a_request_waits_for_a_slot() -> None:
    program = _Steps(["ahead", "new", "late"])
    worker = StageWorker("code2wav", program, lambda *a: None, lambda *a: None, max_active=2)
    now = time.monotonic()
    worker.update_pace(PaceSnapshot(POLICY, {"ahead": (now, 30.0), "new": (None, 0.0), "late": (None, 0.0)}))
    worker.start()
    assert program.done.wait(10)
    worker.stop()
    assert {"ahead", "new"} <= set(program.stepped[:30]) and "late" not in program.stepped
