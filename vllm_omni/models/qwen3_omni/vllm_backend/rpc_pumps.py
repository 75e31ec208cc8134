"""Many talker requests' text pushes to their engine, batched into one `collective_rpc`.

Every RPC waits for the engine loop between two steps and then for a round trip to the
worker processes, so one call per request per step would take more of the engine's time
than its steps under load. Requests asking while a call is in flight are served together
by the next one.
"""

from __future__ import annotations

import asyncio
from typing import Any

SETTLE_TIMEOUT_S = 10.0  # a push in flight to an engine that died never returns


class _Pump:
    """One task at a time sends what is waiting, until nothing is."""

    _task: asyncio.Task | None = None

    def _wake(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop a call that may never return (its engine died)."""
        if self._task is not None:
            self._task.cancel()


class TextPump(_Pump):
    """Pushes the thinker's trailing text into the engine's `TextFeed` (talker_feed.py) for
    many requests with one `collective_rpc("omni_push_texts")`; each request has at most one
    push waiting (its pusher awaits each), so a request's text arrives in order."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._waiting: dict[str, tuple[list[int], bool, asyncio.Future]] = {}
        self._in_flight: set[str] = set()  # requests in the call on its way, which ends `_flight_done`
        self._flight_done: asyncio.Future | None = None

    async def push(self, request_id: str, token_ids: list[int], finished: bool) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = (token_ids, finished, future)
        self._wake()
        await future

    async def settle(self, request_id: str) -> None:
        """Nothing of `request_id` is on its way any more: a waiting push is dropped, one in
        flight is awaited (so a later `omni_forget` cannot overtake it)."""
        self._waiting.pop(request_id, None)
        if request_id in self._in_flight and self._flight_done is not None:
            await asyncio.wait([self._flight_done], timeout=SETTLE_TIMEOUT_S)

    async def _pump(self) -> None:
        while self._waiting:
            batch = {rid: push for rid, push in self._waiting.items() if not push[2].done()}
            self._waiting = {}
            if not batch:
                continue
            self._in_flight, self._flight_done = set(batch), asyncio.get_running_loop().create_future()
            try:
                await self.engine.collective_rpc("omni_push_texts", args=(
                    [[rid, tokens, finished] for rid, (tokens, finished, _) in batch.items()],))
                outcome: Exception | None = None
            except Exception as exc:  # e.g. a dead engine: every waiting push fails with it
                outcome = exc
            finally:
                self._flight_done.set_result(None)
                self._in_flight = set()
            for *_, future in batch.values():
                if future.done():
                    continue
                if outcome is None:
                    future.set_result(None)
                else:
                    future.set_exception(outcome)
