"""Two API frontends on one pipeline (`vllm-omni serve --api-server-count 2`), served by the
real CLI on the tiny checkpoint's duplex deploy: sessions accepted by either frontend
complete with the same answer, a duplex session resumes through either frontend (the other
relays it to the owner), /metrics sums both, and a frontend that dies ends the server."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.realtime_helpers import MODEL_NAME, append_events, fixture_pcm, free_port
from vllm_omni.client.duplex import DuplexConnection
from vllm_omni.client.url import realtime_url
from vllm_omni.config import get_deploy_config_path, modify_stage_config

VLLM_OMNI = Path(sys.executable).parent / "vllm-omni"
FRONTEND = "x-vllm-omni-frontend"
START_TIMEOUT_S = 180.0
MAX_TRIES = 40  # connections until each frontend got one: the kernel picks by hash, 2^-40 to miss


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen]]:
    folder = tmp_path_factory.mktemp("frontends")
    config = modify_stage_config(get_deploy_config_path("qwen3_omni_tiny_cpu_duplex"),
                                 {"stages.1.default_sampling_params.max_tokens": 48}, folder / "deploy.yaml")
    port = free_port()
    log = (folder / "server.log").open("w")
    process = subprocess.Popen([str(VLLM_OMNI), "serve", str(tiny_checkpoint), "--deploy-config", str(config),
                                "--port", str(port), "--served-model-name", MODEL_NAME, "--api-server-count", "2",
                                "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, process, folder / "server.log")
        yield base, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()


def _wait_healthy(base: str, process: subprocess.Popen, log: Path) -> None:
    """Until both frontends answer (each starts listening when it is ready)."""
    deadline, healthy = time.monotonic() + START_TIMEOUT_S, set()
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
        try:
            response = httpx.get(f"{base}/health", timeout=2)
            if response.status_code == 200:
                healthy.add(response.headers[FRONTEND])
        except httpx.TransportError:
            pass
        if len(healthy) == 2:
            return
        time.sleep(0.1)
    raise AssertionError(f"the server did not start in {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")


def frontend_of(conn: DuplexConnection) -> str:
    return conn.ws.response.headers[FRONTEND]


async def one_on_each_frontend(base: str) -> dict[str, DuplexConnection]:
    connections: dict[str, DuplexConnection] = {}
    for _ in range(MAX_TRIES):
        conn = await DuplexConnection.start(realtime_url(base, model=MODEL_NAME))
        if frontend_of(conn) in connections:
            await conn.close_session()
        else:
            connections[frontend_of(conn)] = conn
        if len(connections) == 2:
            return connections
    raise AssertionError(f"every connection went to frontend {list(connections)}")


async def ask(conn: DuplexConnection) -> str:
    """One spoken question; the transcript of the spoken answer."""
    await conn.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await conn.commit()
    await conn.send({"type": "response.create"})
    done = (await conn.until("response.done"))[-1]
    assert done["response"]["status"] == "completed"
    assert any(e["type"] == "response.output_audio.delta" for e in conn.events)
    return "".join(e["delta"] for e in conn.events if e["type"] == "response.output_audio_transcript.delta")


async def test_sessions_on_both_frontends_complete_with_the_same_answer(server) -> None:
    base, _ = server
    connections = await one_on_each_frontend(base)
    assert sorted(connections) == ["0", "1"]
    answers = await asyncio.gather(*(ask(conn) for conn in connections.values()))
    assert answers[0] and answers[0] == answers[1]  # greedy decoding: one engine, one answer
    for conn in connections.values():
        assert "error" not in [e["type"] for e in conn.events]
        await conn.close_session()


async def test_a_duplex_session_resumes_through_either_frontend(server) -> None:
    base, _ = server
    conn = await DuplexConnection.start(realtime_url(base, model=MODEL_NAME), ack_every=4)
    owner = frontend_of(conn)
    await conn.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await conn.commit()
    await conn.send({"type": "response.create"})
    await conn.until("response.output_audio.delta")
    relayed = False
    for _ in range(MAX_TRIES):
        conn.ws.transport.abort()  # the network went away
        generation = conn.attachment_generation
        resumed = await conn.resume()
        assert resumed["attachment_generation"] == generation + 1 == conn.attachment_generation
        if frontend_of(conn) != owner:
            relayed = True
            break
    assert relayed, f"every resume went to frontend {owner}"
    done = (await conn.until("response.done"))[-1]
    assert done["response"]["status"] == "completed"
    seqs = [e["server_event_seq"] for e in conn.events if "server_event_seq" in e]
    assert seqs == list(range(1, len(seqs) + 1))  # every event once, none missing, across the relay
    assert "error" not in [e["type"] for e in conn.events]
    await conn.close_session()  # through the relay: the owner ends the session


def test_metrics_and_health_sum_both_frontends(server) -> None:
    base, _ = server
    totals: dict[str, float] = {}
    for _ in range(MAX_TRIES):
        response = httpx.get(f"{base}/metrics", timeout=5)
        totals[response.headers[FRONTEND]] = float(
            re.search(r"^vllm_omni_realtime_sessions_total (\S+)$", response.text, re.M).group(1))
        if len(totals) == 2:
            break
    assert len(totals) == 2 and totals["0"] == totals["1"] >= 3  # the sessions of both earlier tests
    health = httpx.get(f"{base}/health", timeout=5).json()
    assert health["status"] == "ok" and health["active_sessions"] == 0


def test_a_frontend_that_dies_ends_the_server(server) -> None:
    _, process = server
    frontends = [child for child in psutil.Process(process.pid).children()
                 if any("spawn_main" in part for part in child.cmdline())]
    assert len(frontends) == 2
    frontends[0].kill()
    assert process.wait(60) == 1
    assert not any(child.is_running() for child in frontends)
