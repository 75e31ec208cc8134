"""benchmarks/scheduler_gaps.py: the late-wake-up probe that tells a machine's own scheduling
gaps from the stack's stalls."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scheduler_gaps.py"


def load_script():
    spec = importlib.util.spec_from_file_location("scheduler_gaps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gap_summary_counts_each_bound_and_the_worst() -> None:
    summary = load_script().gap_summary([(1.0, 60.0), (2.0, 150.0), (3.5, 700.0)], 10.04)
    assert summary["over_ms"] == {"50": 3, "100": 2, "200": 1, "500": 1}
    assert summary["max_ms"] == 700.0 and summary["seconds"] == 10.0
    assert load_script().gap_summary([], 1.0)["max_ms"] == 0.0


def test_a_wake_up_held_off_is_recorded_with_its_delay() -> None:
    script = load_script()
    clock = iter([0.0, 0.005, 0.4, 0.405])  # the second wake-up comes 390 ms after the first
    script.time = SimpleNamespace(monotonic=lambda: next(clock), sleep=lambda seconds: None)
    rounds = iter([False, False, False, True])
    assert script.late_wakeups(lambda: next(rounds), 0.005, 0.05) == [(0.005, 390.0)]


def test_the_probe_runs_beside_a_command_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "gaps.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--idle-s", "0.3", "--out", str(out), "--",
                           sys.executable, "-c", "import time; time.sleep(0.5)"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"idle", "command"}
    assert report["runs"]["command"]["seconds"] >= 0.5
    assert "command" in done.stdout and "max ms" in done.stdout
