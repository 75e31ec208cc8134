"""The `vllm-omni` command line: help, config show, make-tiny-model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_omni.cli.main import main

REPO = Path(__file__).resolve().parents[1]
VLLM_OMNI = Path(sys.executable).parent / "vllm-omni"


def test_console_script_help() -> None:
    result = subprocess.run([str(VLLM_OMNI), "--help"], capture_output=True, text=True, check=True)
    for command in ("make-tiny-model", "config"):
        assert command in result.stdout


def test_config_show_prints_merged_duplex_config(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["config", "show", str(REPO / "configs/qwen3_omni_duplex.yaml"), "--platform", "cuda"])
    assert code == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["session_mode"] == "duplex"
    thinker = shown["stages"][0]
    assert thinker["engine_args"]["limit_mm_per_prompt"] == {"audio": 16, "image": 8, "video": 0}
    assert thinker["engine_args"]["max_num_seqs"] == 32  # the cuda override
    assert shown["stages"][1]["default_sampling_params"]["top_k"] == 50  # from the base file


def test_config_show_error_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("stages:\n  - {stage_id: 0, role: thinker, backend: vllm, devices: zero}\n")
    result = subprocess.run([str(VLLM_OMNI), "config", "show", str(bad), "--platform", "cpu"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "broken.yaml: stages[0].devices: expected a list, got 'zero'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("arch", ["qwen3_omni_moe", "minicpmo_4_5"])
def test_make_tiny_model_writes_a_checkpoint(tmp_path: Path, arch: str) -> None:
    result = subprocess.run([str(VLLM_OMNI), "make-tiny-model", "--arch", arch,
                             "--out", str(tmp_path / "tiny"), "--seed", "3"],
                            capture_output=True, text=True, check=True)
    assert f"wrote tiny {arch} checkpoint" in result.stdout
    assert (tmp_path / "tiny" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "tiny" / "config.json").read_text())["architectures"]


def test_serve_with_a_broken_config_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("stages: []\n")
    result = subprocess.run([str(VLLM_OMNI), "serve", str(tmp_path), "--deploy-config", str(bad)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "broken.yaml: stages" in result.stderr
    assert "Traceback" not in result.stderr
