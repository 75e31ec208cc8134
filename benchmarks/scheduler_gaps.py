"""Does the machine itself stall? A high-priority sleeper's missed wake-ups while a command runs.

    .venv/bin/python benchmarks/scheduler_gaps.py --out gaps.json -- \\
        .venv/bin/vllm-omni bench realtime --url http://127.0.0.1:8000 --sessions 8 --turns 3 ...

A probe process (at nice -5 when allowed) sleeps `--period-ms` at a time for as long as the
command runs and records every wake-up that came more than `--threshold-ms` late: time the
whole machine gave it no core. Nothing our server does at nice 0 or its engines at nice 10
should hold a nice -5 sleeper off a core for long, so a late wake-up of hundreds of ms is a
gap in the machine's scheduling (a busy host under a virtual machine, a kernel that does not
preempt), and a playback stall that lines up with one is the machine's, not the stack's.
`--idle-s` first probes the idle machine for the same comparison. Writes JSON (every gap, in
seconds from the probe's start) and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PROBE_NICE = -5


def late_wakeups(done: Callable[[], bool], period_s: float, threshold_s: float) -> list[tuple[float, float]]:
    """(seconds since the start, ms late) of each wake-up more than `threshold_s` late, sleeping
    `period_s` at a time until `done()`."""
    started = last = time.monotonic()
    late: list[tuple[float, float]] = []
    while not done():
        time.sleep(period_s)
        now = time.monotonic()
        if now - last - period_s > threshold_s:
            late.append((round(last - started, 3), round((now - last - period_s) * 1000, 1)))
        last = now
    return late


def gap_summary(late: Sequence[tuple[float, float]], seconds: float) -> dict[str, Any]:
    """How many wake-ups came more than 50 / 100 / 200 / 500 ms late, the worst, and the whole."""
    delays = [ms for _, ms in late]
    return {"seconds": round(seconds, 1), "max_ms": max(delays, default=0.0),
            "over_ms": {str(bound): sum(1 for ms in delays if ms > bound) for bound in (50, 100, 200, 500)},
            "late_wakeups": [list(item) for item in late]}


def probe_process(seconds: float | None, period_ms: float, threshold_ms: float) -> subprocess.Popen[str]:
    """This script in probe mode, lifted to PROBE_NICE where the OS allows it."""
    command = [sys.executable, __file__, "--probe", "--period-ms", str(period_ms), "--threshold-ms", str(threshold_ms)]
    if seconds is not None:
        command += ["--probe-seconds", str(seconds)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def run_probe(args: argparse.Namespace) -> None:
    """Probe mode: until stdin closes (or --probe-seconds pass), then print the late wake-ups."""
    with contextlib.suppress(PermissionError):  # unprivileged: the probe runs at nice 0
        os.nice(PROBE_NICE)
    started = time.monotonic()
    if args.probe_seconds is not None:
        stop_at = started + args.probe_seconds
        late = late_wakeups(lambda: time.monotonic() >= stop_at, args.period_ms / 1000, args.threshold_ms / 1000)
    else:
        stdin_closed = threading.Event()
        threading.Thread(target=lambda: (sys.stdin.read(), stdin_closed.set()), daemon=True).start()
        late = late_wakeups(stdin_closed.is_set, args.period_ms / 1000, args.threshold_ms / 1000)
    print(json.dumps({"seconds": time.monotonic() - started, "late": late}))


def probed(probe: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    """Closes the probe's stdin (which ends an open-ended probe) and reads its report."""
    out, _ = probe.communicate(timeout=timeout_s)
    found = json.loads(out)
    return gap_summary([tuple(item) for item in found["late"]], found["seconds"])


def format_table(runs: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'run':<10} {'seconds':>8} {'>50ms':>6} {'>100ms':>7} {'>200ms':>7} {'>500ms':>7} {'max ms':>8}"]
    for name, run in runs.items():
        over = run["over_ms"]
        lines.append(f"{name:<10} {run['seconds']:>8} {over['50']:>6} {over['100']:>7} {over['200']:>7} "
                     f"{over['500']:>7} {run['max_ms']:>8}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("scheduler_gaps.json"))
    parser.add_argument("--idle-s", type=float, default=10.0, help="probe the idle machine this long first (0: skip)")
    parser.add_argument("--period-ms", type=float, default=5.0)
    parser.add_argument("--threshold-ms", type=float, default=50.0)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe-seconds", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run under the probe")
    args = parser.parse_args(argv)
    if args.probe:
        run_probe(args)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to probe after --")
    runs: dict[str, dict[str, Any]] = {}
    if args.idle_s > 0:
        print(f"probing the idle machine for {args.idle_s:.0f} s", file=sys.stderr)
        idle = probe_process(args.idle_s, args.period_ms, args.threshold_ms)
        runs["idle"] = probed(idle, args.idle_s + 30)
    probe = probe_process(None, args.period_ms, args.threshold_ms)
    returncode = subprocess.call(command)
    runs["command"] = probed(probe, 30)
    args.out.write_text(json.dumps({"command": command, "returncode": returncode, "period_ms": args.period_ms,
                                    "threshold_ms": args.threshold_ms, "runs": runs}, indent=1))
    print(format_table(runs))
    print(f"wrote {args.out}")
    return returncode


if __name__ == "__main__":
    sys.exit(main())
