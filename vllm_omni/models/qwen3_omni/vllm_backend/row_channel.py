"""The thinker's prompt rows from its worker straight to the driver, over a ZeroMQ socket.

The talker starts from the rows of the thinker's prompt (talker_bridge.py) once the
thinker's first token exists. Asked for with `collective_rpc`, they would come only when
the engine loop has finished the step it runs by then (the second token's): a whole thinker
step after the first token, 8-20 ms on the tiny CPU config at one session and 24-48 ms at
eight (benchmarks/ttfp_breakdown.py). So the worker pushes a request's rows at the end of
the step that completes its prompt (capture.py), ahead of that step's output, as
frame_channel.py does for the talker's frames.

Only requests that ask for their rows (`REPORT_ROWS_KEY` in their sampling params'
`extra_args`) are pushed; a family whose talker reads the answer too gets each fed answer
token's rows at the end of its step, each message naming the position it starts at. The
driver binds a PULL socket at an `ipc://` address it passes to the engine in vLLM's
`additional_config`; the worker of tensor-parallel rank 0 connects a PUSH socket to it. A
message is [request id, tensor_wire.py's header and the first position as JSON, the bytes].
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import torch

from vllm_omni.engine.backends.vllm.tensor_wire import tensor_from_wire, tensor_to_wire
from vllm_omni.models.qwen3_omni.vllm_backend.ipc_channel import PullChannel, new_ipc_address, push_socket

logger = logging.getLogger(__name__)

ROW_ADDRESS_KEY = "omni_row_address"  # in vLLM's additional_config
REPORT_ROWS_KEY = "omni_report_rows"  # in a request's SamplingParams.extra_args: push its rows


def reports_rows(sampling_params: Any) -> bool:
    """Whether a vLLM request asked for its prompt rows."""
    return bool((sampling_params.extra_args or {}).get(REPORT_ROWS_KEY)) if sampling_params is not None else False


def new_row_address() -> str:
    return new_ipc_address("rows")


class RowSender:
    """The worker's end: pushes rows, never blocks the step (a message queues in ZeroMQ)."""

    def __init__(self, address: str):
        self._socket = push_socket(address)

    def send(self, request_id: str, rows: torch.Tensor, position: int = 0) -> None:
        """Rows [n, layers, H] of the request's positions [position, position + n)."""
        header = tensor_to_wire(rows)
        data = header.pop("data")
        self._socket.send_multipart([request_id.encode(), json.dumps({**header, "position": position}).encode(), data],
                                    copy=False)


class RowMailbox:
    """One request's rows as they arrive, by the position they start at."""

    def __init__(self) -> None:
        self._rows: dict[int, asyncio.Future] = {}

    def _slot(self, position: int) -> asyncio.Future:
        return self._rows.setdefault(position, asyncio.get_running_loop().create_future())

    def put(self, position: int, rows: torch.Tensor) -> None:
        slot = self._slot(position)
        if not slot.done():
            slot.set_result(rows)

    async def take(self, position: int, timeout_s: float) -> torch.Tensor:
        """The rows starting at `position`, waiting for them at most `timeout_s` (TimeoutError)."""
        rows = await asyncio.wait_for(asyncio.shield(self._slot(position)), timeout_s)
        del self._rows[position]
        return rows

    def close(self) -> None:
        for slot in self._rows.values():
            slot.cancel()
        self._rows.clear()


class RowReceiver(PullChannel):
    """The driver's end: one reader task files incoming rows in the mailboxes of the requests
    expecting them (rows of a request not open are dropped)."""

    def __init__(self, address: str):
        super().__init__(address)
        self._mailboxes: dict[str, RowMailbox] = {}

    def open(self, request_id: str) -> RowMailbox:
        """The request's mailbox (open it before the request reaches the engine)."""
        return self._mailboxes.setdefault(request_id, RowMailbox())

    def close_request(self, request_id: str) -> None:
        mailbox = self._mailboxes.pop(request_id, None)
        if mailbox is not None:
            mailbox.close()

    def deliver(self, request_id: str, rows: torch.Tensor, position: int = 0) -> None:
        mailbox = self._mailboxes.get(request_id)
        if mailbox is not None:
            mailbox.put(position, rows)

    async def _read(self) -> None:
        while True:
            parts = await self._socket.recv_multipart()
            try:
                request_id, header, data = parts
                fields = json.loads(header)
                position = int(fields.pop("position", 0))
                rows = tensor_from_wire({**fields, "data": data})
            except (ValueError, TypeError) as bad:  # never from our worker; one bad message must not stop the rest
                logger.warning("thinker row channel: unreadable message (%s)", bad)
                continue
            self.deliver(request_id.decode(), rows, position)
