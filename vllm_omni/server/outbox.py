"""Outgoing events of one connection: an ordered queue and the single task that writes it, so
events leave in the order they were produced and a slow client only slows its own session."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from vllm_omni.metrics import prometheus as metrics
from vllm_omni.protocol.wire_text import wire_text

logger = logging.getLogger(__name__)

SEND_QUEUE_HIGH_WATER = 256  # events; producers pause above this
FLUSH_TIMEOUT_S = 5.0  # what is queued when a session ends gets this long to leave


class Outbox:
    """Ordered outgoing events and the one task that writes them.

    The writer ends when the socket does, when one send takes longer than `send_timeout_s`
    (a peer that stopped reading: the transport's own keepalive cannot notice it once the
    write buffer is full), or on a bug; `task` finishing is the signal to end the session.
    """

    def __init__(self, websocket: WebSocket, send_timeout_s: float):
        self.websocket = websocket
        self.send_timeout_s = send_timeout_s
        self._events: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._closed = False
        self.task = asyncio.create_task(self._write(), name="realtime-writer")

    def put(self, payload: dict[str, Any]) -> None:
        if self._closed:
            return
        if payload.get("type") == "error":
            code = payload.get("code") or payload.get("error", {}).get("code", "unknown")
            metrics.ERRORS.labels(code=str(code)).inc()
        self._events.append(payload)
        self._ready.set()
        if len(self._events) > SEND_QUEUE_HIGH_WATER:
            self._drained.clear()

    async def wait_writable(self) -> None:
        await self._drained.wait()

    async def _write(self) -> None:
        try:
            while not (self._closed and not self._events):
                await self._ready.wait()
                self._ready.clear()
                while self._events:
                    text = wire_text(self._events.popleft())
                    await asyncio.wait_for(self.websocket.send_text(text), self.send_timeout_s)
                    if len(self._events) <= SEND_QUEUE_HIGH_WATER // 2:
                        self._drained.set()
        except asyncio.TimeoutError:
            logger.warning("client read nothing for %.0f s: dropping the connection", self.send_timeout_s)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the socket is gone
        except Exception:
            logger.exception("writing an event failed: ending the session")
        finally:
            self._closed = True
            self._drained.set()

    async def flush_and_stop(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        """Send what is queued (within `timeout`), then stop the writer."""
        self._closed = True  # nothing new is queued; the writer ends once the queue is empty
        self._ready.set()
        done, _ = await asyncio.wait({self.task}, timeout=timeout)
        if not done:
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=timeout)
