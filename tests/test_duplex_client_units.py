"""The duplex client's bookkeeping without a server: each numbered event delivered once, acks
every N events, timeline positions mapped to send times, the lead-in silence of speech."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from vllm_omni.client.duplex import DuplexConnection
from vllm_omni.client.streaming import append_events, without_lead_in


class FakeSocket:
    """Hands out the given frames, then waits forever; records what is sent."""

    def __init__(self, frames: list[dict[str, Any]]):
        self.frames = [json.dumps(frame) for frame in frames]
        self.sent: list[dict[str, Any]] = []

    async def recv(self) -> str:
        if self.frames:
            return self.frames.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def close(self) -> None:
        pass


async def test_repeated_numbers_are_dropped_and_delivery_is_acknowledged() -> None:
    frames = [{"type": "session.resumed"}] + [{"type": "x", "server_event_seq": n} for n in (1, 2, 2, 3, 1, 4, 5)]
    ws = FakeSocket(frames)
    conn = DuplexConnection(ws)
    conn.ack_every = 2
    delivered = [await conn.next(timeout=1) for _ in range(6)]
    assert [e.get("server_event_seq") for e in delivered] == [None, 1, 2, 3, 4, 5]
    assert conn.duplicates == 2 and conn.last_seq == 5
    assert [e["server_event_seq"] for e in ws.sent] == [2, 4]
    await conn.ack()
    assert ws.sent[-1] == {"type": "session.event_ack", "server_event_seq": 5} and conn.acked_seq == 5
    await conn.close()


async def test_a_timeline_position_maps_to_the_send_time_of_its_append() -> None:
    conn = DuplexConnection(FakeSocket([]))
    for append in append_events(b"\1\0" * 16000, chunk_ms=250):  # 1 s in four appends
        await conn.send(append)
    ends = [end for end, _ in conn.sent_marks]
    assert ends == [250, 500, 750, 1000]
    assert conn.sent_at(0) == conn.sent_at(249) == conn.sent_marks[0][1]
    assert conn.sent_at(250) == conn.sent_marks[1][1] and conn.sent_at(1000) is None
    await conn.close()


def test_the_lead_in_silence_is_left_out() -> None:
    speech = (1000).to_bytes(2, "little", signed=True) + (-2000).to_bytes(2, "little", signed=True)
    assert without_lead_in(b"\0\0" * 800 + (5).to_bytes(2, "little") + speech) == speech
    assert without_lead_in(b"\0\0" * 10) == b""
