"""The pipeline on a Ray cluster of two nodes, both started with `ray start` on this machine,
each with a custom resource: the thinker's actor on one node, the talker's and code2wav's on
the other. The text and audio prompts of the parity suite give the single-process run's
tokens and PCM, a realtime turn works through the server, and killing the worker node's Ray
processes fails the request in flight within 2 s, shows on /health, and once the node is
started again new requests succeed with the same server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import audio_fixture_path
from tests.engine_helpers import long_request, make_engine, run_request, wait_until_idle
from tests.realtime_helpers import free_port, serving
from tests.test_engine_behaviour import request, same_output
from vllm_omni.cli.main import main
from vllm_omni.config import RayCluster, RayPlacement
from vllm_omni.engine import AudioChunk

pytest.importorskip("ray", reason="Ray is the `ray` extra")

RAY = str(Path(sys.executable).with_name("ray"))
NODE_OF = {"thinker": "node_a", "talker": "node_b", "code2wav": "node_b"}
RECOVERY_TIMEOUT_S = 300.0


class LocalCluster:
    """A head and a worker node on this machine, told apart by their custom resources."""

    def __init__(self) -> None:
        self.port = free_port()
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}

    def _ray(self, *args: str) -> None:
        subprocess.run([RAY, *args], env=self.env, check=True, capture_output=True, timeout=180)

    def start_head(self) -> None:
        self._ray("start", "--head", f"--port={self.port}", "--num-cpus=2", "--resources",
                  json.dumps({"node_a": 8}), "--include-dashboard=false", "--disable-usage-stats")

    def start_worker(self) -> None:
        self._ray("start", f"--address=127.0.0.1:{self.port}", "--num-cpus=2", "--resources",
                  json.dumps({"node_b": 8}), "--disable-usage-stats")

    def kill_worker(self) -> None:
        """SIGKILL the worker node's raylet and everything it started (its actors included)."""
        raylets = [p for p in psutil.process_iter(["cmdline"])
                   if p.info["cmdline"] and p.info["cmdline"][0].endswith("/raylet")
                   and "node_b" in " ".join(p.info["cmdline"])]
        assert len(raylets) == 1, f"expected the worker's raylet, found {len(raylets)}"
        doomed = [raylets[0], *raylets[0].children(recursive=True)]
        for process in doomed:
            process.kill()
        psutil.wait_procs(doomed, timeout=10)

    def stop(self) -> None:
        subprocess.run([RAY, "stop", "--force"], env=self.env, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    import ray

    local = LocalCluster()
    try:
        local.start_head()
        local.start_worker()
        yield local
    finally:
        ray.shutdown()  # a driver left connected exits its process once the cluster is gone (60 s later)
        local.stop()


@pytest.fixture(scope="module")
def on_ray(cluster, tiny_loaded):
    engine = make_engine(tiny_loaded, restart_on_failure=True, ray=RayCluster(address=f"127.0.0.1:{cluster.port}"),
                         placements={role: RayPlacement(resources={node: 1}) for role, node in NODE_OF.items()})
    yield engine
    engine.shutdown()


def test_the_stages_run_on_the_nodes_their_placement_names(on_ray) -> None:
    import ray

    node_resources = {node["NodeID"]: node["Resources"] for node in ray.nodes() if node["Alive"]}
    for role, node in NODE_OF.items():
        (replica,) = on_ray.workers[role].replicas
        assert node in node_resources[replica.node_id], (role, node_resources[replica.node_id])


def test_text_and_audio_prompts_equal_the_single_process_run(on_ray, reference_engine) -> None:
    for prompt in (dict(text="Tell me a story about the sea."), dict(audio="speech_en_single.wav")):
        alone = asyncio.run(run_request(reference_engine, request(**prompt)))
        remote = asyncio.run(run_request(on_ray, request(**prompt)))
        assert remote["final"].finish_reason in ("stop", "length") and len(remote["pcm"]) > 0
        assert same_output(alone, remote), prompt


def test_a_realtime_turn_through_the_server(on_ray, tmp_path: Path, capsys) -> None:
    with serving(on_ray, borrowed=True) as (url, _, _):
        out = tmp_path / "answer.wav"
        code = main(["client", "--url", url.replace("ws://", "http://"), "--wav",
                     str(audio_fixture_path("speech_en_single.wav")), "--out", str(out), "--fast"])
        printed = capsys.readouterr().out
    assert code == 0 and "turn 1:" in printed, printed
    with wave.open(str(out)) as wav:
        assert wav.getnframes() > 0


def test_a_lost_node_fails_its_requests_fast_and_its_return_restores_the_stages(on_ray, cluster) -> None:
    async def killed_mid_answer() -> tuple[float, object]:
        outputs: list = []

        async def consume() -> None:
            async for output in on_ray.generate(long_request(talker=600)):
                outputs.append((time.monotonic(), output))

        task = asyncio.create_task(consume())
        while not any(isinstance(o, AudioChunk) for _, o in outputs):  # talker and code2wav at work
            assert not task.done(), outputs[-1:]
            await asyncio.sleep(0.01)
        cluster.kill_worker()
        killed = time.monotonic()
        await asyncio.wait_for(task, 10)
        at, final = outputs[-1]
        return at - killed, final

    with serving(on_ray, borrowed=True) as (url, _, _):
        took_s, final = asyncio.run(killed_mid_answer())
        assert final.finish_reason == "error" and final.error_code == "stage_unavailable", final
        assert "died" in final.error and took_s < 2.0, (took_s, final.error)
        health = httpx.get(url.replace("ws://", "http://") + "/health")
        assert health.status_code == 503 and {"talker", "code2wav"} <= set(health.json()["dead_stages"])

        cluster.start_worker()
        began = time.monotonic()
        while on_ray.unhealthy_stages():
            assert time.monotonic() - began < RECOVERY_TIMEOUT_S, on_ray.unhealthy_stages()
            time.sleep(0.5)
        assert httpx.get(url.replace("ws://", "http://") + "/health").json()["status"] == "ok"
        after = asyncio.run(run_request(on_ray, request("Are you back?")))
        assert after["final"].finish_reason in ("stop", "length") and len(after["pcm"]) > 0
        asyncio.run(wait_until_idle(on_ray, 5.0))
