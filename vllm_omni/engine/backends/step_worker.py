"""One thread per stage: takes messages, steps its requests, hands events on.

The worker sleeps on its inbox while none of its requests can progress, and wakes the
moment a message arrives, so a ready output is forwarded at once instead of waiting for a
polling round. Between any two steps it reads the inbox again, so an abort takes effect
within one step. Only the `max_active` oldest requests of the stage (its `max_num_seqs`)
are stepped; later ones wait, in arrival order, without holding KV cache. The program's
own request table decides who is admitted, so a late message for a request that already
ended in this stage cannot occupy a slot. Within a round, requests are stepped nearest
playback deadline first, and answers far ahead of their listener sit the round out while
another listener waits (engine/pacing.py).

A program that can step several requests at once (`BatchedStageProgram`, e.g. code2wav
decoding many streams in one conv pass) gets each round's requests, in that same order, in
one `step_batch` call; the inbox is then read between rounds, so an abort takes effect
within one round. A failing batch fails each of its requests still open: a batch may have
advanced some of them before it failed, so stepping them again one by one to find the
culprit could repeat or skip their work.

Why threads in one process (torch backend): all stages share the model weights loaded
once, tensors pass between stages without copies, and torch kernels release the GIL, so
the stages of one pipeline do run in parallel on different cores. The vLLM
backend runs its engines in processes of their own (vLLM's EngineCore).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from vllm_omni.engine.pacing import PaceSnapshot
from vllm_omni.engine.stage_api import BatchedStageProgram, StageProgram

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0  # how long an idle worker sleeps before re-checking that it should run
STOP_TIMEOUT_S = 10.0

EventSink = Callable[[str, str, object], None]  # (stage role, request id, event)
ErrorSink = Callable[[str, str, Exception], None]


class StageWorker:
    def __init__(self, role: str, program: StageProgram, on_event: EventSink, on_error: ErrorSink,
                 max_active: int):
        self.role = role
        self.program = program
        self._on_event, self._on_error = on_event, on_error
        self.max_active = max_active
        self._inbox: queue.SimpleQueue[tuple[str, str, object]] = queue.SimpleQueue()
        self._running = True
        self._pace: PaceSnapshot | None = None
        self._thread = threading.Thread(target=self._run, name=f"stage-{role}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, request_id: str, message: object) -> None:
        self._inbox.put(("message", request_id, message))

    def drop(self, request_id: str) -> None:
        self._inbox.put(("drop", request_id, None))

    def update_pace(self, snapshot: PaceSnapshot) -> None:
        """The latest playback pacing; also wakes a worker whose requests all yield."""
        self._inbox.put(("pace", "", snapshot))

    def drop_all(self) -> None:
        """Forget every request of a dead worker (its thread has ended: nothing else touches
        the program any more)."""
        for request_id in self.program.request_ids():
            self.program.drop(request_id)

    def stop(self) -> None:
        self._running = False
        self._inbox.put(("stop", "", None))
        self._thread.join(timeout=STOP_TIMEOUT_S)

    def num_requests(self) -> int:
        return len(self.program.request_ids())

    def healthy(self) -> bool:
        return self._thread.is_alive()

    def queue_depth(self) -> int:
        return self._inbox.qsize() + max(0, self.num_requests() - self.max_active)

    def _admitted(self) -> set[str]:
        return set(self.program.request_ids()[: self.max_active])

    def _handle(self, kind: str, request_id: str, message: object) -> None:
        if kind == "pace":
            self._pace = message
        elif kind == "drop":
            self.program.drop(request_id)
        elif kind == "message":
            try:
                self.program.accept(request_id, message)
            except Exception as exc:  # a bad message fails its request only
                self._fail(request_id, exc)

    def _drain(self, block: bool, wait_s: float = IDLE_WAIT_S) -> None:
        try:
            item = self._inbox.get(timeout=wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _fail(self, request_id: str, exc: Exception) -> None:
        logger.exception("stage %s failed on request %s", self.role, request_id)
        self.program.drop(request_id)
        self._on_error(self.role, request_id, exc)

    def _emit(self, request_id: str, event: object) -> None:
        self._on_event(self.role, request_id, event)

    def _round(self) -> tuple[list[str], float]:
        """The requests to step this round, in order, and how long to sleep if there are none."""
        admitted = self._admitted()
        runnable = [rid for rid in self.program.runnable() if rid in admitted]
        # No yielding while a request waits for a slot: only an answer's end frees one.
        if self._pace is None or not runnable or len(self.program.request_ids()) > self.max_active:
            return runnable, IDLE_WAIT_S
        now = time.monotonic()
        yielding = self._pace.yielding(runnable, now)
        ready = self._pace.order([rid for rid in runnable if rid not in yielding], now)
        change_s = self._pace.next_change_s(yielding, now)
        return ready, IDLE_WAIT_S if change_s is None else min(IDLE_WAIT_S, change_s)

    def _run(self) -> None:
        while self._running:
            self._drain(block=False)
            runnable, wait_s = self._round()
            if not runnable:
                self._drain(block=True, wait_s=wait_s)
                continue
            if isinstance(self.program, BatchedStageProgram):
                self._step_batch(self.program, runnable)
            else:
                self._step_each(runnable)

    def _step_each(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if request_id not in self.program.request_ids():  # ended or dropped during this round
                continue
            try:
                self.program.step(request_id, self._emit)
            except Exception as exc:
                self._fail(request_id, exc)
            self._drain(block=False)

    def _step_batch(self, program: BatchedStageProgram, request_ids: list[str]) -> None:
        try:
            program.step_batch(request_ids, self._emit)
        except Exception as exc:
            open_ids = set(program.request_ids())
            for request_id in request_ids:
                if request_id in open_ids:  # not those the batch finished before it failed
                    self._fail(request_id, exc)
