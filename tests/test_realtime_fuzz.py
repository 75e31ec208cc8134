"""Hostile clients against a real server (torch config, tiny checkpoint): seeded fuzzing of
every field of every client event, broken frames, lone surrogates, invalid UTF-8, clients
that stop reading, and bad audio content. The server must answer each bad event with an
`error`, never with `internal_error` or an exception in its log, keep the session usable,
and end every session with nothing left counted."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
import websockets

from tests.fuzz_events import mutated_event, raw_frame
from tests.realtime_helpers import append_events, connect, fixture_pcm, running_server

SESSIONS = 4
EVENTS_PER_SESSION = 700
BATCH = 50


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def server_errors_logged() -> Iterator[list[logging.LogRecord]]:
    """ERROR records of the server (ours and uvicorn's, which does not propagate to root)."""
    handler = _Collect()
    loggers = [logging.getLogger(name) for name in ("vllm_omni", "uvicorn.error", "uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@pytest.fixture(scope="module")
def server(tiny_loaded):
    with running_server(tiny_loaded, {}, send_timeout_s=2.0) as (url, engine, _):
        yield url, engine


def counts(url: str) -> tuple[int, int]:
    health = httpx.get(url.replace("ws://", "http://") + "/health").json()
    return health["active_sessions"], health["active_requests"]


async def wait_for_zero(url: str, timeout: float = 5.0) -> tuple[int, int]:
    deadline = asyncio.get_running_loop().time() + timeout
    while (now := counts(url)) != (0, 0) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return now


async def spoken_turn(client) -> dict:
    """Speech, a manual commit, a response: the turn must complete."""
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    done = (await client.until("response.done", timeout=120))[-1]
    assert done["response"]["status"] == "completed", done["response"]["status_details"]
    return done


async def fuzz_one_session(url: str, seed: int) -> int:
    rng = random.Random(seed)
    client = await connect(url)
    await client.next()
    await client.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    await client.until("session.updated")
    sent = 0
    for batch in range(EVENTS_PER_SESSION // BATCH):
        expected_ids, anonymous = set(), 0
        for i in range(BATCH):
            if rng.random() < 0.2:
                await client.send(raw_frame(rng))
                anonymous += 1
            else:
                event = mutated_event(rng, f"fuzz-{seed}-{batch}-{i}")
                if isinstance(event.get("event_id"), str):
                    expected_ids.add(event["event_id"])
                else:
                    anonymous += 1
                await client.send(event)
        sent += BATCH
        await client.send({"type": "session.heartbeat"})
        replies = await client.until("session.heartbeat_ack", timeout=60)
        errors = [e["error"] for e in replies if e["type"] == "error"]
        others = [e["type"] for e in replies if e["type"] not in ("error", "session.heartbeat_ack")]
        assert not others, others  # a refused event changes nothing
        assert not [e for e in errors if e["code"] == "internal_error"], errors
        assert {e["event_id"] for e in errors if "event_id" in e} == expected_ids
        assert sum("event_id" not in e for e in errors) == anonymous
    await spoken_turn(client)  # the session still works
    await client.close()
    return sent


def test_fuzzed_events_each_get_an_error_and_sessions_stay_usable(server) -> None:
    url, _ = server
    with server_errors_logged() as logged:
        async def scenario():
            sent = await asyncio.gather(*(fuzz_one_session(url, seed) for seed in range(SESSIONS)))
            assert sum(sent) >= SESSIONS * EVENTS_PER_SESSION
            assert await wait_for_zero(url) == (0, 0)

        asyncio.run(scenario())
    assert not logged, [r.getMessage() for r in logged]


def test_lone_surrogates_and_invalid_utf8_never_jam_a_slot(server) -> None:
    url, _ = server

    async def surrogate_session():
        client = await connect(url)
        await client.next()
        await client.send('{"type":"session.update","event_id":"s1","session":{"instructions":"\\ud800"}}')
        error = (await client.until("error"))[-1]["error"]
        assert error["code"] == "invalid_json" and "surrogate" in error["message"]
        await client.send({"type": "session.heartbeat"})
        await client.until("session.heartbeat_ack", timeout=5)
        return client

    async def invalid_utf8_session():
        ws = await websockets.connect(url + "/v1/realtime")
        await ws.recv()
        await ws.send(b'{"type":"session.heartbeat","x":"\xff\xfe"}', text=True)  # not UTF-8, as a text frame
        with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
            for _ in range(10):
                await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007  # invalid frame payload data

    async def scenario():
        client = await surrogate_session()
        await spoken_turn(client)
        await client.close()
        for _ in range(25):
            await (await surrogate_session()).close()
            await invalid_utf8_session()
        assert await wait_for_zero(url) == (0, 0)

    asyncio.run(scenario())


def _float32_b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<f4").tobytes()).decode()


BAD_CONTENT = [
    ("empty item audio", {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": ""}]}},
     "bad_audio", "item.content.0.audio"),
    ("300-sample item audio", {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user",
        "content": [{"type": "input_audio", "audio": base64.b64encode(b"\1\0" * 300).decode()}]}},
     "bad_audio", "item.content"),
    ("item content a number", {"type": "conversation.item.create", "item": {"type": "message", "content": 5}},
     "bad_event", "item.content"),
    ("NaN float32 append", {"type": "input_audio_buffer.append", "input_audio_format": "pcm_f32le",
                            "audio": _float32_b64(np.array([0.1, np.nan] * 800))}, "bad_audio", "audio"),
    ("Inf float32 append", {"type": "input_audio_buffer.append", "input_audio_format": "pcm_f32le",
                            "audio": _float32_b64(np.array([np.inf] * 1600))}, "bad_audio", "audio"),
    ("truncate at Infinity", '{"type":"conversation.item.truncate","item_id":"x","audio_end_ms":Infinity}',
     "invalid_json", None),
    ("truncate at a string", {"type": "conversation.item.truncate", "item_id": "x", "audio_end_ms": "end"},
     "bad_event", "audio_end_ms"),
    ("wrong session.audio", {"type": "session.update", "session": {"audio": "x"}}, "bad_event", "audio"),
    ("is_speech NaN", '{"type":"input_audio_buffer.append","audio":"AAAA","is_speech":NaN}', "invalid_json", None),
    ("huge max_output_tokens", {"type": "response.create", "response": {"max_output_tokens": 1.2e29}},
     "bad_event", "response.max_output_tokens"),
    ("over-long close reason", {"type": "session.close", "reason": "r" * 10_000}, "bad_event", "reason"),
]


def test_bad_content_is_refused_naming_the_field_and_the_next_turn_completes(server) -> None:
    url, _ = server
    with server_errors_logged() as logged:
        async def scenario():
            client = await connect(url)
            await client.next()
            for name, payload, code, param in BAD_CONTENT:
                await client.send(payload)
                error = (await client.until("error"))[-1]["error"]
                assert (error["code"], error.get("param")) == (code, param), (name, error)
            # 20 samples, then commit: refused as too short; the buffer is kept and later audio completes it
            await client.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\1\0" * 20).decode()})
            await client.send({"type": "input_audio_buffer.commit", "event_id": "short"})
            error = (await client.until("error"))[-1]["error"]
            assert (error["code"], error["event_id"]) == ("input_audio_buffer_commit_empty", "short")
            await spoken_turn(client)  # no clear or delete needed
            await spoken_turn(client)
            await client.close()
            assert await wait_for_zero(url) == (0, 0)

        asyncio.run(scenario())
    assert not logged, [r.getMessage() for r in logged]


def _masked_text_frame(text: str) -> bytes:
    """A client->server WebSocket text frame (clients must mask)."""
    payload, mask = text.encode(), os.urandom(4)
    size = len(payload)
    length = bytes([0x80 | size]) if size < 126 else (bytes([0x80 | 126]) + struct.pack("!H", size) if size < 65536
                                                      else bytes([0x80 | 127]) + struct.pack("!Q", size))
    masked = (np.frombuffer(payload, np.uint8) ^ np.resize(np.frombuffer(mask, np.uint8), size)).tobytes()
    return b"\x81" + length + mask + masked


def test_a_client_that_stops_reading_is_dropped_and_its_slot_freed(server) -> None:
    """A raw socket with a tiny receive buffer that never reads after the handshake: the
    server's writes stop making progress, and after `send_timeout_s` (2 s here) the session
    ends, its slot and engine requests freed."""
    url, _ = server
    host, port = url.removeprefix("ws://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(f"GET /v1/realtime HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101")
        sock.sendall(_masked_text_frame(json.dumps({"type": "conversation.item.create", "item": {
            "id": "item_big", "type": "message", "role": "system",
            "content": [{"type": "input_text", "text": "x" * 1_000_000}]}})))
        for _ in range(60):  # ~60 MB of replies that are never read
            sock.sendall(_masked_text_frame('{"type":"conversation.item.retrieve","item_id":"item_big"}'))
        deadline = time.monotonic() + 30
        while counts(url) != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counts(url) == (0, 0)
