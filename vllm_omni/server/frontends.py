"""Several API frontends on one engine (`vllm-omni serve --api-server-count N`).

This process keeps the engine and serves it to the frontends (engine/engine_host.py); each
frontend is a process of its own that runs the whole HTTP and WebSocket surface (sessions,
VAD, log-mel, protocol) against a `RemoteEngine`. All frontends listen on the same port
(SO_REUSEPORT: the kernel spreads new connections over them); a realtime session stays on
the frontend that accepted it. Each frontend also listens on a private loopback port, to
which the others relay a duplex `session.resume` for a session it owns. /metrics sums every
frontend (prometheus_client's multiprocess mode). A frontend that dies ends the server, as
one that cannot serve its sessions should not linger behind a load balancer.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass
from typing import Any

from vllm_omni.engine.engine_host import EngineHost
from vllm_omni.engine.interface import ServedEngine
from vllm_omni.server.settings import ServerSettings

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 15.0  # for the frontends to finish their connections once told to stop


@dataclass(frozen=True)
class FrontendSpec:
    index: int
    host: str
    port: int
    socket_path: str  # the engine host's
    settings: ServerSettings
    uvicorn_options: dict[str, Any]
    log_level: str


def serve_frontends(engine: ServedEngine, settings: ServerSettings, count: int, host: str, port: int,
                    uvicorn_options: dict[str, Any], log_level: str) -> int:
    """Run `count` frontends on `engine` until a signal stops the server (0) or a frontend
    dies (1)."""
    workdir = tempfile.mkdtemp(prefix="vllm-omni-")  # mode 0700: only this user reaches the engine socket
    socket_path = os.path.join(workdir, "engine.sock")
    specs = [FrontendSpec(index, host, port, socket_path, settings, uvicorn_options, log_level)
             for index in range(count)]
    try:
        return asyncio.run(_run(engine, specs, os.path.join(workdir, "metrics")))
    finally:
        engine.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


async def _run(engine: ServedEngine, specs: list[FrontendSpec], metrics_dir: str) -> int:
    host = EngineHost(engine, specs[0].socket_path)
    await host.start()
    processes = _start_frontends(specs, metrics_dir)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    stopped = asyncio.ensure_future(stop.wait())
    exited = loop.run_in_executor(None, multiprocessing.connection.wait, [p.sentinel for p in processes])
    await asyncio.wait({stopped, exited}, return_when=asyncio.FIRST_COMPLETED)
    code = 0 if stop.is_set() else 1
    if code:
        dead = [p.name for p in processes if not p.is_alive()]
        logger.error("%s exited: stopping the server", ", ".join(dead))
    stopped.cancel()
    for process in processes:
        if process.is_alive():
            process.terminate()  # uvicorn's graceful shutdown
    await loop.run_in_executor(None, _join, processes)
    await host.close()
    return code


def _start_frontends(specs: list[FrontendSpec], metrics_dir: str) -> list[multiprocessing.process.BaseProcess]:
    """Spawned (never forked: this process runs engine threads), each with the multiprocess
    metrics folder in its environment."""
    os.mkdir(metrics_dir)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=run_frontend, args=(spec,), name=f"frontend-{spec.index}", daemon=True)
                 for spec in specs]
    previous = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        for process in processes:
            process.start()
    finally:
        if previous is None:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = previous
    return processes


def _join(processes: list[multiprocessing.process.BaseProcess]) -> None:
    for process in processes:
        process.join(STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()


def run_frontend(spec: FrontendSpec) -> None:
    """A frontend process's main."""
    import torch

    logging.basicConfig(level=spec.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s frontend-{spec.index} %(name)s: %(message)s")
    torch.set_num_threads(1)  # its torch work is log-mel; the cores belong to the engine
    asyncio.run(_serve_frontend(spec))


async def _serve_frontend(spec: FrontendSpec) -> None:
    import uvicorn

    from vllm_omni.engine.remote_engine import RemoteEngine
    from vllm_omni.server.app import create_app
    from vllm_omni.server.frontend_identity import FrontendIdentity

    engine = await RemoteEngine.connect(spec.socket_path)
    public = _listening_socket(spec.host, spec.port, reuse_port=True)
    private = _listening_socket("127.0.0.1", 0, reuse_port=False)
    address = f"127.0.0.1:{private.getsockname()[1]}"
    app = create_app(engine, spec.settings, FrontendIdentity(spec.index, address, engine))
    server = uvicorn.Server(uvicorn.Config(app, log_level=spec.log_level, **spec.uvicorn_options))

    async def exit_with_host() -> None:
        await engine.closed.wait()
        logger.error("the engine host went away: this frontend stops")
        server.should_exit = True

    watch = asyncio.ensure_future(exit_with_host())
    try:
        await server.serve(sockets=[public, private])
    finally:
        watch.cancel()


def _listening_socket(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
