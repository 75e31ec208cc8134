"""A real server on a free port, and a small WebSocket client for the realtime tests."""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
import time
import wave
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.conftest import audio_fixture_path
from vllm_omni.client.connection import RealtimeConnection as Client
from vllm_omni.client.streaming import append_events as client_append_events
from vllm_omni.config import get_deploy_config_path, load_deploy_config, modify_stage_config
from vllm_omni.engine import OmniEngine
from vllm_omni.engine.interface import ServedEngine
from vllm_omni.models.qwen2_5_omni.checkpoint import Qwen25OmniCheckpoint
from vllm_omni.models.qwen2_5_omni.family import Qwen25OmniFamily
from vllm_omni.models.qwen3_omni.family import Qwen3OmniFamily
from vllm_omni.server.app import create_app
from vllm_omni.server.settings import ServerSettings

MODEL_NAME = "qwen3-omni-tiny"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_server(checkpoint, overrides: dict[str, Any], **settings: Any):
    """Serve a loaded tiny checkpoint (Qwen3-Omni's or Qwen2.5-Omni's) with its tiny CPU torch
    config plus `overrides`; yield the ws URL."""
    qwen2_5 = isinstance(checkpoint, Qwen25OmniCheckpoint)
    config = "qwen2_5_omni_tiny_cpu_torch" if qwen2_5 else "qwen3_omni_tiny_cpu_torch"
    deploy = load_deploy_config(modify_stage_config(get_deploy_config_path(config), overrides), platform="cpu")
    engine = OmniEngine((Qwen25OmniFamily if qwen2_5 else Qwen3OmniFamily)(checkpoint, deploy))
    with serving(engine, **settings) as served:
        yield served


@contextmanager
def sampling_defaults(engine: OmniEngine, by_role: dict[str, dict[str, Any]]):
    """A shared engine's default sampling changed for a while (per stage role), then put back:
    each request reads the defaults when it is made (engine/prompting.py), so a module can size
    its answers without starting engines of its own."""
    family = engine.family
    original = family.deploy
    stages = [stage.model_copy(update={"default_sampling_params": stage.default_sampling_params.model_copy(
        update=by_role.get(stage.role, {}))}) for stage in original.stages]
    family.deploy = original.model_copy(update={"stages": stages})
    try:
        yield
    finally:
        family.deploy = original


class Borrowed:
    """An engine served for a while and handed back: the server's shutdown leaves it running
    (for engines shared by several test modules)."""

    def __init__(self, engine: OmniEngine):
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def shutdown(self) -> None:
        pass


@functools.cache
def borrowed_loop() -> asyncio.AbstractEventLoop:
    """One event loop, in a daemon thread for the whole test run, that serves every borrowed
    engine: an engine's output tasks live on the loop that first used it (vLLM's AsyncLLM), so
    an engine shared by several modules must stay on one loop."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="borrowed-engines", daemon=True).start()
    return loop


@contextmanager
def serving(engine: ServedEngine, model_name: str = MODEL_NAME, *, borrowed: bool = False,
            **settings: Any):
    """Serve an existing engine on a free port; yield (ws URL, engine, app). The server shuts
    the engine down when it stops, unless it is `borrowed` (then it runs on `borrowed_loop`)."""
    app = create_app(Borrowed(engine) if borrowed else engine,
                     ServerSettings(served_model_names=[model_name], **settings))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           ws_max_size=16 * 1024 * 1024))
    if borrowed:
        served = asyncio.run_coroutine_threadsafe(server.serve(), borrowed_loop())
        stop = functools.partial(served.result, timeout=30)
    else:
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        stop = functools.partial(thread.join, timeout=30)
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield f"ws://127.0.0.1:{port}", engine, app
    finally:
        server.should_exit = True
        stop()


def append_events(pcm: bytes) -> list[dict[str, Any]]:
    """100 ms appends, sent back to back by the tests."""
    return client_append_events(pcm, chunk_ms=100)


def fixture_pcm(name: str, trailing_silence_s: float = 0.0) -> bytes:
    with wave.open(str(audio_fixture_path(name))) as wav:
        data = wav.readframes(wav.getnframes())
    return data + b"\0\0" * int(16000 * trailing_silence_s)


async def connect(url: str, path: str = "/v1/realtime", extensions: bool = True) -> Client:
    """A client of `url`; `extensions=False`: a pure-GA session, as a third-party client gets."""
    return await Client.open(url + path, extensions=extensions)
