"""A real server on a free port, and a small WebSocket client for the realtime tests."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
import wave
from contextlib import contextmanager
from typing import Any

import uvicorn
import websockets

from tests.conftest import audio_fixture_path
from vllm_omni.config import get_deploy_config_path, load_deploy_config, modify_stage_config
from vllm_omni.engine import OmniEngine
from vllm_omni.models.qwen3_omni.pipeline import Qwen3OmniPipeline
from vllm_omni.server.app import create_app
from vllm_omni.server.realtime import ServerSettings

MODEL_NAME = "qwen3-omni-tiny"
CHUNK = 3200  # 100 ms of 16 kHz PCM16


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_server(checkpoint, overrides: dict[str, Any], **settings: Any):
    """Serve the tiny checkpoint with the tiny CPU config plus `overrides`; yield the ws URL."""
    path = modify_stage_config(get_deploy_config_path("qwen3_omni_tiny_cpu"), overrides)
    deploy = load_deploy_config(path, platform="cpu")
    engine = OmniEngine(Qwen3OmniPipeline(checkpoint, deploy), deploy)
    app = create_app(engine, ServerSettings(served_model_names=[MODEL_NAME], **settings))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           ws_max_size=16 * 1024 * 1024))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield f"ws://127.0.0.1:{port}", engine
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def fixture_pcm(name: str, trailing_silence_s: float = 0.0) -> bytes:
    with wave.open(str(audio_fixture_path(name))) as wav:
        data = wav.readframes(wav.getnframes())
    return data + b"\0\0" * int(16000 * trailing_silence_s)


def append_events(pcm: bytes, size: int = CHUNK) -> list[dict[str, Any]]:
    return [{"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i:i + size]).decode()}
            for i in range(0, len(pcm), size)]


class Client:
    """Sends JSON events and collects what the server sends, with timeouts on every wait."""

    def __init__(self, ws):
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    async def send(self, payload: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(payload if isinstance(payload, (str, bytes)) else json.dumps(payload))

    async def send_all(self, payloads: list[dict[str, Any]], delay: float = 0.0) -> None:
        for payload in payloads:
            await self.send(payload)
            if delay:
                await asyncio.sleep(delay)

    async def next(self, timeout: float = 60.0) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        event["_t"] = time.monotonic()
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Events up to and including the next one of type `kind`."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            event = await self.next(max(0.1, deadline - time.monotonic()))
            seen.append(event)
            if event["type"] == kind:
                return seen


async def connect(url: str, path: str = "/v1/realtime", **kwargs: Any):
    return await websockets.connect(url + path, max_size=None, **kwargs)
