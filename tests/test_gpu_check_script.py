"""scripts/gpu_check.sh, without a GPU: its dry run lists every step, and every file the steps
name exists in the repository (a renamed test module or config would break the check on the
one machine where it matters), in the full mode and in the offline one (--offline WHEELS)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run(out: Path, *options: str) -> list[str]:
    """The steps the dry run lists (commands.txt); checks that nothing ran."""
    done = subprocess.run(["bash", "scripts/gpu_check.sh", *options, "--dry-run", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not list(out.glob("*.log"))  # nothing ran
    return (out / "commands.txt").read_text().splitlines()


def check_steps(steps: list[str], names: list[str], config: str) -> set[str]:
    """The steps are `names` (the venv step is left out where the venv exists), the bench runs
    1, 8 and 32 sessions, and every repository file they name exists; returns those files."""
    assert [line.split(" ")[0].rstrip(":") for line in steps] == names[-len(steps):]
    named = {path for line in steps
             for path in re.findall(r"\b(?:tests|configs|requirements)/[\w/.-]+\.(?:py|yaml|wav|txt)", line)}
    assert {config, "tests/test_pipeline_parity.py", "tests/data/speech_en_single.wav"} <= named
    assert all((ROOT / path).is_file() for path in named), named
    assert "--sessions 1,8,32" in steps[-1]
    return named


def test_dry_run_lists_the_steps_and_names_files_that_exist(tmp_path: Path) -> None:
    steps = dry_run(tmp_path)
    check_steps(steps, ["venv", "install", "tiny-model", "tests", "server", "bench"],
                "configs/qwen3_omni_tiny_gpu.yaml")
    assert "[cuda,dev,bench]" in steps[-5]


def limits(steps: list[str]) -> int:
    """The steps' time limits added up."""
    return sum(int(limit) for limit in re.findall(r"^\S+ \(limit (\d+)s\)", "\n".join(steps), re.MULTILINE))


def test_offline_dry_run_installs_from_the_wheel_folder_and_runs_torch_on_the_gpu(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"  # need not exist for a dry run
    steps = dry_run(tmp_path / "out", "--offline", str(wheels))
    named = check_steps(steps, ["venv", "install-deps", "install", "versions", "tiny-model", "tests", "server",
                                "bench"], "configs/qwen3_omni_tiny_gpu_torch.yaml")
    assert "requirements/gpu-offline.txt" in named
    assert (ROOT / "scripts/gpu_wheels.sh").is_file()
    venv, install_deps, install = steps[0], steps[1], steps[2]
    assert "--system-site-packages" in venv and ".venv-gpu-offline" in venv
    for line in (install_deps, install):
        assert f"--no-index --find-links {wheels} " in line
    assert "--no-deps" in install and install.endswith(" vllm-omni")
    assert "cuda" not in install and "vllm_backend" not in " ".join(steps)
    assert limits(steps) <= 8 * 60  # the server's limit is its time to become healthy


def test_the_wheel_list_leaves_out_what_the_target_has() -> None:
    """requirements/gpu-offline.txt never names torch, transformers, vLLM or nvidia-* (the target has
    the first two; the offline mode runs without the others), nor what transformers brings."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements/gpu-offline.txt").read_text().splitlines()]
    names = {re.split(r"[<>=!~;\[ ]", line)[0].lower() for line in lines if line}
    assert {"fastapi", "uvicorn", "websockets", "pytest", "matplotlib", "torchvision"} <= names
    assert not names & {"torch", "transformers", "vllm", "numpy", "safetensors", "tokenizers", "huggingface_hub",
                        "pyyaml"}
    assert not [name for name in names if name.startswith("nvidia")]


def test_unknown_arguments_are_refused() -> None:
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--fast"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "unknown argument --fast" in done.stderr
