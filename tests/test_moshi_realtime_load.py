"""The acceptance load of docs/moshi.md ("Batching"), measured as a listener measures it: the
real CLI serves the tiny Moshi (configs/moshi_tiny_cpu.yaml) in its own process, and
`vllm-omni bench native` in another streams 4 sessions × 20 s of speech at real time, one append
per 80 ms frame as a microphone sends them. Every frame must be decided, with a decision lag
(decision received − the frame's audio sent) p95 under one frame period, in every session."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.realtime_helpers import fixture_pcm, free_port

VLLM_OMNI = Path(sys.executable).parent / "vllm-omni"
REPO = Path(__file__).resolve().parent.parent
MODEL = "moshi-tiny"
FRAME_MS = 80
CLIP_S = 20
START_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def server(moshi_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("moshi-serve")
    port = free_port()
    log_path = folder / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([str(VLLM_OMNI), "serve", str(moshi_checkpoint), "--deploy-config",
                                    str(REPO / "configs" / "moshi_tiny_cpu.yaml"), "--port", str(port),
                                    "--served-model-name", MODEL, "--log-level", "warning"],
                                   stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _healthy(base):
                assert process.poll() is None, f"the server exited:\n{log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"no server after {START_TIMEOUT_S:.0f} s:\n{log_path.read_text()}"
                time.sleep(0.2)
            yield base
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_four_sessions_at_real_time_pace_decide_every_frame_within_a_frame(server: str, tmp_path: Path) -> None:
    clip = tmp_path / "speech_20s.wav"
    with wave.open(str(clip), "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16000)
        out.writeframes((fixture_pcm("speech_en_long.wav") * 2)[: 2 * 16 * 1000 * CLIP_S])
    bench = subprocess.run([str(VLLM_OMNI), "bench", "native", "--url", server, "--wav", str(clip), "--own-voice",
                            "--sessions", "4", "--model", MODEL, "--out-dir", str(tmp_path / "bench")],
                           capture_output=True, text=True, timeout=300)
    print(bench.stdout)
    assert bench.returncode == 0, bench.stderr
    row = json.loads((tmp_path / "bench" / "native.json").read_text())["results"][0]
    frames = CLIP_S * 1000 // FRAME_MS
    assert (row["sessions"], row["unit_ms"], row["clip_units"]) == (4, FRAME_MS, frames)
    assert (row["failed_sessions"], row["error_events"], row["units_decided"]) == (0, 0, 4 * frames)
    assert row["decision_lag_ms"]["p95"] < FRAME_MS, row["decision_lag_ms"]
    assert [session["units"] for session in row["per_session"]] == [frames] * 4
