"""The offline API (`vllm_omni.Omni`) as a user meets it: examples/offline_speech.py in its
own process, on each turn-based family's tiny checkpoint, asks a spoken question and writes
the spoken answer to a WAV at the family's output rate."""

from __future__ import annotations

import os
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from tests.conftest import DATA, REPO

FAMILIES = {  # checkpoint fixture, deploy config, output rate
    "qwen3_omni": ("tiny_checkpoint", "qwen3_omni_tiny_cpu_torch.yaml", 24000),
    "qwen2_5_omni": ("qwen2_5_omni_checkpoint", "qwen2_5_omni_tiny_cpu_torch.yaml", 24000),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_offline_example_writes_the_spoken_answer(family: str, request: pytest.FixtureRequest,
                                                  tmp_path: Path) -> None:
    fixture, config, rate = FAMILIES[family]
    checkpoint = request.getfixturevalue(fixture)
    out = tmp_path / "answer.wav"
    done = subprocess.run([sys.executable, str(REPO / "examples" / "offline_speech.py"), "--model", str(checkpoint),
                           "--deploy-config", str(REPO / "configs" / config),
                           "--wav", str(DATA / "speech_en_single.wav"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "text: '" in done.stdout and f"wrote {out}" in done.stdout
    with wave.open(str(out)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (rate, 1, 2)
        assert wav.getnframes() > rate // 10  # a tenth of a second of speech at least
