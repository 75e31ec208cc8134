"""Codec frames from the talker's worker straight to the stage driver, over a ZeroMQ socket.

A frame is complete once its codebook-0 id is sampled and the code predictor has run
(talker_worker.py, right after vLLM's sampler). The worker pushes the step's frames at once,
before vLLM even returns the step's output, so a frame leaves the engine with the step that
made it. Asking for them with `collective_rpc` instead would wait for the engine loop, which
by then is running the next step: every frame would be a step late, the first one included.

The driver binds a PULL socket at an `ipc://` address it passes to the engine in vLLM's
`additional_config`; the worker of tensor-parallel rank 0 connects a PUSH socket to it (a
restarted engine connects again). Messages are JSON: {request id: [[16 codes], ...]}.
"""

from __future__ import annotations

import asyncio
import logging

from vllm_omni.models.qwen3_omni.vllm_backend.ipc_channel import PullChannel, new_ipc_address, push_socket

logger = logging.getLogger(__name__)

FRAME_ADDRESS_KEY = "omni_frame_address"  # in vLLM's additional_config


def ends_request(code0: int, sampled: int, eos_token_id: int, max_tokens: int) -> bool:
    """Whether the `sampled`-th codebook-0 id ends its request (EOS, or the last of max_tokens):
    that id makes no frame, as in the reference."""
    return code0 == eos_token_id or sampled >= max_tokens


def new_frame_address() -> str:
    return new_ipc_address("frames")


class FrameSender:
    """The worker's end: pushes frames, never blocks the step (a message queues in ZeroMQ)."""

    def __init__(self, address: str):
        self._socket = push_socket(address)

    def send(self, frames: dict[str, list[list[int]]]) -> None:
        if frames:
            self._socket.send_json(frames)


class FrameReceiver(PullChannel):
    """The driver's end: one reader task files incoming frames under their request, for the
    requests that are open (frames of a request no longer open are dropped)."""

    def __init__(self, address: str):
        super().__init__(address)
        self._queues: dict[str, asyncio.Queue] = {}

    def open(self, request_id: str) -> asyncio.Queue:
        """The request's frame queue (open it before the request reaches the engine)."""
        return self._queues.setdefault(request_id, asyncio.Queue())

    def close_request(self, request_id: str) -> None:
        self._queues.pop(request_id, None)

    async def _read(self) -> None:
        while True:
            try:
                message = await self._socket.recv_json()
            except ValueError as bad:  # never from our worker; one bad message must not stop the rest
                logger.warning("talker frame channel: unreadable message (%s)", bad)
                continue
            for request_id, frames in message.items():
                queue = self._queues.get(request_id)
                if queue is not None:
                    for frame in frames:
                        queue.put_nowait(frame)
