"""`vllm-omni bench capacity`: how many concurrent sessions a server serves within a service
target. Levels of concurrent sessions (bench/realtime.py's or bench/chat.py's rows) are
measured, one session first, as the reference, then doubling until a level fails the target,
then bisecting between the last level that passed and the first that failed; the capacity is
the largest level that passed (0 when one session already fails)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.bench.report import percentile_series, pyplot, save_figure, write_json
from vllm_omni.client.playback import PLAYOUT_BUFFERS_MS

Row = dict[str, Any]  # a level's row (bench/realtime.py's `level_row`)


@dataclass(frozen=True)
class Target:
    """The service target a level must meet: RTF p95 under `max_rtf_p95`, playable-start p95 at
    most `max_playable_start_ratio` times the one-session level's, every session and turn
    completed, no error events and no audio lost."""

    max_rtf_p95: float = 1.0
    max_playable_start_ratio: float = 2.0


def playable_start_ratio(row: Row, reference: Row) -> float | None:
    """The level's playable-start p95 over the one-session level's; None when either is missing."""
    play, base = row["playable_start_ms"]["p95"], reference["playable_start_ms"]["p95"]
    return None if play is None or not base else play / base


def failed_because(row: Row, reference: Row, target: Target) -> list[str]:
    """Why the level `row` fails `target` (`reference`: the one-session level); empty: it passes."""
    counts = ((row["failed_sessions"], "failed session(s)"), (row["error_events"], "error event(s)"),
              (row["lost_audio_turns"], "turn(s) with lost audio"))
    reasons = [f"{count} {what}" for count, what in counts if count]
    if row["completed_turns"] < row["turns"]:
        reasons.append(f"{row['completed_turns']}/{row['turns']} turns completed")
    rtf = row["rtf"]["p95"]
    if rtf is None:
        reasons.append("no RTF (no audio)")
    elif rtf >= target.max_rtf_p95:
        reasons.append(f"RTF p95 {rtf:.3f} ≥ {target.max_rtf_p95}")
    ratio = playable_start_ratio(row, reference)
    if row["playable_start_ms"]["p95"] is None:
        reasons.append("no playable start (no audio)")
    elif ratio is not None and ratio > target.max_playable_start_ratio:
        reasons.append(f"playable start p95 {row['playable_start_ms']['p95']:.0f} ms is {ratio:.2f}× one "
                       f"session's (> {target.max_playable_start_ratio}×)")
    return reasons


def judged(row: Row, reference: Row, target: Target) -> Row:
    """`row` with its `verdict` ("pass" / "fail"), the `reasons` it failed, and its playable-start
    ratio to the one-session level."""
    reasons = failed_because(row, reference, target)
    return {**row, "verdict": "fail" if reasons else "pass", "reasons": reasons,
            "playable_start_ratio": playable_start_ratio(row, reference)}


def doubling(start: int, max_sessions: int) -> list[int]:
    """start, 2 start, 4 start, … up to and including `max_sessions`."""
    levels = [start]
    while levels[-1] < max_sessions:
        levels.append(min(levels[-1] * 2, max_sessions))
    return levels


def search_capacity(measure: Callable[[int], Row], target: Target, *, start: int = 1,
                    max_sessions: int = 64) -> tuple[list[Row], int]:
    """The judged levels in the order `measure(sessions)` ran them, and the capacity. One
    session is measured first, as the reference; if it fails, the capacity is 0. Then
    `doubling(start, max_sessions)` until a level fails, then bisection between the last
    level that passed and the first that failed until they are adjacent; each verdict is said
    on stderr."""
    rows: list[Row] = []

    def run(sessions: int) -> bool:
        measured = measure(sessions)
        row = judged(measured, rows[0] if rows else measured, target)  # the first level is the reference
        rows.append(row)
        print(f"capacity: {sessions} session(s): {row['verdict']}"
              + (f" ({'; '.join(row['reasons'])})" if row["reasons"] else ""), file=sys.stderr, flush=True)
        return not row["reasons"]

    if not run(1):
        return rows, 0
    passed, failed = 1, None
    for sessions in doubling(start, max_sessions):
        if sessions == 1:
            continue
        if not run(sessions):
            failed = sessions
            break
        passed = sessions
    while failed is not None and failed - passed > 1:
        middle = (passed + failed) // 2
        passed, failed = (middle, failed) if run(middle) else (passed, middle)
    return rows, passed


def format_table(rows: list[Row]) -> str:
    """One line per level, by sessions: verdict, turns completed, RTF p95, playable-start p95 and
    its ratio to one session's, stalls behind the largest playout buffer, failed sessions and why
    it failed."""
    def cell(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    buffer = str(PLAYOUT_BUFFERS_MS[-1])
    lines = [f"{'sessions':>8s} {'verdict':>7s} {'done':>9s} {'RTF p95':>8s} {'play p95':>9s} {'ratio':>6s} "
             f"{'stalls@' + buffer:>10s} {'failures':>8s}  why"]
    for row in sorted(rows, key=lambda row: row["sessions"]):
        done = f"{row['completed_turns']}/{row['turns']}"
        lines.append(f"{row['sessions']:8d} {row['verdict']:>7s} {done:>9s} {cell(row['rtf']['p95'], 3):>8s} "
                     f"{cell(row['playable_start_ms']['p95']):>9s} {cell(row['playable_start_ratio'], 2):>6s} "
                     f"{row['stalls_at_buffer_ms'][buffer]['stalls']:10d} {row['failed_sessions']:8d}  "
                     f"{'; '.join(row['reasons'])}")
    return "\n".join(lines)


def capacity_line(capacity: int, rows: list[Row], max_sessions: int) -> str:
    """The verdict in one line (the output's last)."""
    if capacity == 0:
        return "capacity: 0 concurrent sessions (one session already fails the target)"
    if capacity == max_sessions and all(row["verdict"] == "pass" for row in rows):
        return f"capacity: {capacity} concurrent sessions (every level up to --max-sessions passed)"
    return f"capacity: {capacity} concurrent sessions"


def write_plot(rows: list[Row], target: Target, path: Path) -> Path:
    """Playable-start p95 and RTF p95 against sessions, passing levels filled, with the targets."""
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    ordered = sorted(rows, key=lambda row: row["sessions"])
    sessions = [row["sessions"] for row in ordered]
    reference = rows[0]["playable_start_ms"]["p95"]
    panels = ((axes[0], "playable_start_ms", None if reference is None else reference * target.max_playable_start_ratio,
               "playable start p95", "ms"),
              (axes[1], "rtf", target.max_rtf_p95, "real-time factor p95", "generation time / audio duration"))
    for axis, key, limit, title, unit in panels:
        values = percentile_series(ordered, key, "p95")
        axis.plot(sessions, values, color="tab:blue", linewidth=1)
        for verdict, marker in (("pass", "o"), ("fail", "x")):
            chosen = [(n, v) for n, v, row in zip(sessions, values, ordered, strict=True) if row["verdict"] == verdict]
            axis.scatter([n for n, _ in chosen], [v for _, v in chosen], marker=marker, label=verdict, zorder=3)
        if limit is not None:
            axis.axhline(limit, color="tab:red", linewidth=0.8, linestyle="--", label="target")
        axis.set(title=title, xlabel="concurrent sessions", ylabel=unit, xticks=sessions)
        axis.legend()
        axis.grid(alpha=0.3)
    return save_figure(figure, path)


def write_results(rows: list[Row], capacity: int, target: Target, settings: dict[str, Any],
                  out_dir: Path) -> list[Path]:
    """capacity.json (the settings, every level's judged row in the order measured, the
    capacity) and capacity.png."""
    results = {"capacity": capacity, "reference_playable_start_p95_ms": rows[0]["playable_start_ms"]["p95"],
               "levels": rows}
    return [write_json(out_dir, "capacity.json", settings, results), write_plot(rows, target, out_dir / "capacity.png")]
