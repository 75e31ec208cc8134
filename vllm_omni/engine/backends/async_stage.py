"""A stage whose engine schedules by itself (vLLM's AsyncLLM), on an event loop of its own.

Same outside as `StageWorker` (submit, drop, stop, counts), so the orchestrator routes to
either alike. Each request is one task on this stage's loop, started by its first message;
later messages go to the driver's `feed`. Dropping a request cancels its task, which closes
the engine's output stream and so aborts the request there.

A task leaves the request table through a done-callback, not from inside its coroutine: a
task cancelled before its first step never runs its body (nor its `finally`), and a drop
right after the submit does exactly that.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading

from vllm_omni.engine.backends.step_worker import ErrorSink, EventSink
from vllm_omni.engine.pacing import PaceSnapshot
from vllm_omni.engine.stage_api import AsyncStageDriver

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 900.0  # an engine start on a small CPU machine takes about a minute
STOP_TIMEOUT_S = 60.0
PACE_TIMEOUT_S = 5.0


class AsyncEngineStage:
    def __init__(self, role: str, driver: AsyncStageDriver, on_event: EventSink, on_error: ErrorSink,
                 max_active: int):
        self.role, self.driver = role, driver
        self._on_event, self._on_error = on_event, on_error
        self.max_active = max_active
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"stage-{role}", daemon=True)
        self._tasks: dict[str, asyncio.Task] = {}
        self.restarting = False
        self._restart_failed = False
        self._pace: PaceSnapshot | None = None
        self._pace_sender: asyncio.Task | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.driver.start(), self._loop).result(timeout=START_TIMEOUT_S)

    def submit(self, request_id: str, message: object) -> None:
        self._loop.call_soon_threadsafe(self._spawn, request_id, message)

    def drop(self, request_id: str) -> None:
        self._loop.call_soon_threadsafe(self._cancel, request_id)

    def update_pace(self, snapshot: PaceSnapshot) -> None:
        """Send the engine the latest playback pacing; snapshots that pile up while one is
        on its way are skipped (only the newest matters)."""
        self._pace = snapshot
        self._loop.call_soon_threadsafe(self._start_pace_sender)  # whether one runs is decided on the loop

    def _start_pace_sender(self) -> None:
        if self._pace_sender is None or self._pace_sender.done():
            self._pace_sender = self._loop.create_task(self._send_pace())

    async def _send_pace(self) -> None:
        sent = None
        while self._pace is not sent:
            sent = self._pace
            try:
                await asyncio.wait_for(self.driver.push_pace(sent), timeout=PACE_TIMEOUT_S)
            except Exception as exc:  # pacing only reorders work: a lost snapshot is logged, not fatal
                logger.warning("stage %s: playback pacing not delivered: %r", self.role, exc)

    def drop_all(self) -> None:
        """Drop every request (the stage died: a run may wait on its engine forever)."""
        self._loop.call_soon_threadsafe(self._cancel_each)

    def num_requests(self) -> int:
        return len(self._tasks)

    def healthy(self) -> bool:
        return self._thread.is_alive() and not self.restarting and self.driver.healthy()

    def queue_depth(self) -> int:
        return max(0, len(self._tasks) - self.max_active)

    def restart(self) -> None:
        """Replace a dead engine by a new one, in the background; `healthy()` stays False
        until it is up. A failed restart is not retried (the stage stays dead)."""
        if self.restarting or self._restart_failed or not self._thread.is_alive():
            return
        self.restarting = True
        asyncio.run_coroutine_threadsafe(self._restart(), self._loop)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=STOP_TIMEOUT_S)
        except Exception:
            logger.exception("stage %s did not shut down cleanly", self.role)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=STOP_TIMEOUT_S)

    def _cancel_each(self) -> list[asyncio.Task]:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        return tasks

    async def _cancel_all(self) -> None:
        tasks = self._cancel_each()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)

    async def _shutdown(self) -> None:
        if self._pace_sender is not None:
            self._pace_sender.cancel()
        await self._cancel_all()
        await self.driver.shutdown()

    async def _restart(self) -> None:
        logger.warning("stage %s: restarting its engine", self.role)
        try:
            await self._cancel_all()
            await self.driver.shutdown()
            await self.driver.start()
            logger.warning("stage %s: engine restarted", self.role)
        except Exception:
            logger.exception("stage %s: restart failed; the stage stays unavailable", self.role)
            self._restart_failed = True
        finally:
            self.restarting = False

    def _spawn(self, request_id: str, message: object) -> None:
        task = self._tasks.get(request_id)
        if task is not None and not task.done():
            try:
                self.driver.feed(request_id, message)
            except Exception as exc:
                self._on_error(self.role, request_id, exc)
                task.cancel()
        elif self.driver.starts_request(message):
            task = self._loop.create_task(self._serve(request_id, message))
            self._tasks[request_id] = task
            task.add_done_callback(functools.partial(self._forget, request_id))
        # else: a follow-up message for a request this stage has already finished; nothing to do

    def _forget(self, request_id: str, task: asyncio.Task) -> None:
        if self._tasks.get(request_id) is task:  # not a newer request that reuses the id
            del self._tasks[request_id]
            self.driver.forget(request_id)

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def _serve(self, request_id: str, message: object) -> None:
        try:
            await self.driver.run(request_id, message, lambda event: self._on_event(self.role, request_id, event))
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # an engine failure (including a dead engine) fails this request
            if self.driver.healthy():
                logger.exception("stage %s failed on request %s", self.role, request_id)
            else:
                logger.warning("stage %s: request %s ended with the engine: %r", self.role, request_id, exc)
            self._on_error(self.role, request_id, exc)
