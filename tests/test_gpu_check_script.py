"""scripts/gpu_check.sh, without a GPU: its dry run lists every step, and every file the steps
name exists in the repository (a renamed test module or config would break the check on the
one machine where it matters)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dry_run_lists_the_steps_and_names_files_that_exist(tmp_path: Path) -> None:
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = (tmp_path / "commands.txt").read_text().splitlines()
    assert [line.split(" ")[0].rstrip(":") for line in steps] == \
        ["venv", "install", "tiny-model", "tests", "server", "bench"][-len(steps):]
    named = {path for line in steps for path in re.findall(r"\b(?:tests|configs)/[\w/.]+\.(?:py|yaml|wav)", line)}
    assert {"configs/qwen3_omni_tiny_gpu.yaml", "tests/test_pipeline_parity.py",
            "tests/data/speech_en_single.wav"} <= named
    assert all((ROOT / path).is_file() for path in named), named
    assert "--sessions 1,8,32" in steps[-1]
    assert not list(tmp_path.glob("*.log"))  # nothing ran


def test_unknown_arguments_are_refused() -> None:
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--fast"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "unknown argument --fast" in done.stderr
