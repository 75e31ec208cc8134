"""A one-way ZeroMQ channel from an engine's worker to its stage driver, over `ipc://`: the
worker's PUSH socket (`push_socket`) never blocks a step (a message queues in ZeroMQ); the
driver's end (`PullChannel`) binds the address, runs one reader task and, when closed,
removes the socket's file. frame_channel.py and row_channel.py are its two uses."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from typing import Any

import zmq
import zmq.asyncio


def new_ipc_address(kind: str) -> str:
    """A fresh `ipc://` address for a driver's socket (`kind` names it: frames, rows)."""
    return f"ipc://{os.path.join(tempfile.gettempdir(), f'vllm-omni-{kind}-{uuid.uuid4().hex[:12]}')}"


def push_socket(address: str) -> zmq.Socket:
    """The worker's end, connected to the driver's `address`."""
    socket = zmq.Context.instance().socket(zmq.PUSH)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(address)
    return socket


class PullChannel:
    """The driver's end: `start` binds the address and runs `_read` (the subclass's reader
    loop over `self._socket`) as a task; `close` stops it and removes the socket's file."""

    def __init__(self, address: str):
        self.address = address
        self._socket: Any = None
        self._reader: asyncio.Task | None = None

    def start(self) -> None:
        self._socket = zmq.asyncio.Context.instance().socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(self.address)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        path = self.address.removeprefix("ipc://")
        if os.path.exists(path):
            os.unlink(path)
