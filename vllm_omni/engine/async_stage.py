"""A stage whose engine schedules by itself (vLLM's AsyncLLM), on an event loop of its own.

Same outside as `StageWorker` (submit, drop, stop, counts), so the orchestrator routes to
either alike. Each request is one task on this stage's loop, started by its first message;
later messages go to the driver's `feed`. Dropping a request cancels its task, which closes
the engine's output stream and so aborts the request there.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from vllm_omni.engine.stage_worker import ErrorSink, EventSink
from vllm_omni.models.stage_api import AsyncStageDriver

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 900.0  # an engine start on a small CPU machine takes about a minute
STOP_TIMEOUT_S = 60.0


class AsyncEngineStage:
    def __init__(self, role: str, driver: AsyncStageDriver, on_event: EventSink, on_error: ErrorSink,
                 max_active: int):
        self.role, self.driver = role, driver
        self._on_event, self._on_error = on_event, on_error
        self.max_active = max_active
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"stage-{role}", daemon=True)
        self._tasks: dict[str, asyncio.Task] = {}

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.driver.start(), self._loop).result(timeout=START_TIMEOUT_S)

    def submit(self, request_id: str, message: object) -> None:
        self._loop.call_soon_threadsafe(self._spawn, request_id, message)

    def drop(self, request_id: str) -> None:
        self._loop.call_soon_threadsafe(self._cancel, request_id)

    def num_requests(self) -> int:
        return len(self._tasks)

    def healthy(self) -> bool:
        return self._thread.is_alive() and self.driver.healthy()

    def queue_depth(self) -> int:
        return max(0, len(self._tasks) - self.max_active)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=STOP_TIMEOUT_S)
        except Exception:
            logger.exception("stage %s did not shut down cleanly", self.role)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=STOP_TIMEOUT_S)

    async def _shutdown(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self.driver.shutdown()

    def _spawn(self, request_id: str, message: object) -> None:
        if request_id in self._tasks:
            try:
                self.driver.feed(request_id, message)
            except Exception as exc:
                self._on_error(self.role, request_id, exc)
                self._cancel(request_id)
        elif self.driver.starts_request(message):
            self._tasks[request_id] = self._loop.create_task(self._serve(request_id, message))
        # else: a follow-up message for a request this stage has already finished; nothing to do

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
            logger.exception("stage %s failed on request %s", self.role, request_id)
            self._on_error(self.role, request_id, exc)
        finally:
            self._tasks.pop(request_id, None)
