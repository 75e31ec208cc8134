"""The CPU container image (docker/build.sh cpu), started as a user starts it: it builds the
tiny checkpoint, serves it, and answers a realtime turn from `vllm-omni client`. Runs where a
Docker engine answers and the image is built; skipped elsewhere with the reason (building the
image takes minutes and several GB: docker/build.sh). CI (.ci/run) starts an engine, builds
the image and sets VLLM_OMNI_REQUIRE_DOCKER=1, which makes a skip a failure there."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import audio_fixture_path
from tests.realtime_helpers import free_port
from vllm_omni.cli.main import main

IMAGE = os.environ.get("VLLM_OMNI_DOCKER_IMAGE", "vllm-omni:cpu")
START_TIMEOUT_S = 600.0  # two vLLM engines on 2 cores, after building the tiny checkpoint


def _why_not_runnable() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "no Docker engine answers"
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, timeout=60).returncode != 0:
        return f"image {IMAGE} is not built (docker/build.sh cpu)"
    return None


def _wait_healthy(url: str, name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        running = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True,
                                 text=True)
        if running.stdout.strip() != "true":
            break
        time.sleep(2)
    logs = subprocess.run(["docker", "logs", "--tail", "40", name], capture_output=True, text=True)
    raise AssertionError(f"the container did not serve within {START_TIMEOUT_S:.0f} s:\n{logs.stdout}{logs.stderr}")


@pytest.fixture(scope="module")
def served_container() -> Iterator[str]:
    reason = _why_not_runnable()
    if reason is not None and os.environ.get("VLLM_OMNI_REQUIRE_DOCKER") == "1":
        pytest.fail(f"VLLM_OMNI_REQUIRE_DOCKER=1 but {reason}")
    if reason is not None:
        pytest.skip(reason)
    port = free_port()
    name = f"vllm-omni-smoke-{port}"
    subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "--network", "host", "--ipc", "host",
                    "-e", f"PORT={port}", IMAGE], check=True, capture_output=True, timeout=120)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, name)
        yield url
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)


def test_the_cpu_image_serves_the_tiny_model_and_answers_a_turn(served_container: str, tmp_path: Path,
                                                                capsys) -> None:
    out = tmp_path / "answer.wav"
    code = main(["client", "--url", served_container, "--wav", str(audio_fixture_path("speech_en_single.wav")),
                 "--out", str(out), "--fast"])
    printed = capsys.readouterr().out
    assert code == 0 and "turn 1:" in printed, printed
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 24000 and wav.getnframes() > 0
    models = httpx.get(served_container + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["qwen3-omni-tiny"]
