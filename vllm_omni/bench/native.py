"""`vllm-omni bench native`: concurrent natively duplex sessions (docs/realtime-api.md §13.7),
each streaming the same clip at real-time pace; per concurrency level the decision lag (a
unit's decision received − its last audio sent), how many units were decided later than one
unit period (the model's own, from the session's capabilities), and TTFP (a response's first
audio − the audio of the unit that opened it), overall and per session. The one-session level
is the baseline the others are read against. JSON, a printed table and a PNG of decision lag
and TTFP against concurrency."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_omni.bench.report import percentile_series, pyplot, save_figure, write_json
from vllm_omni.client.native_duplex import NativeSessionResult, clip_units, run_native_session
from vllm_omni.client.streaming import MINICPMO_GRID
from vllm_omni.client.timing import summarize


async def run_level(url: str, pcm: bytes, sessions: int, opening: dict[str, Any]) -> dict[str, Any]:
    runs = [run_native_session(url, pcm, opening=opening) for _ in range(sessions)]
    started = time.monotonic()
    outcomes = await asyncio.gather(*runs, return_exceptions=True)
    wall_s = time.monotonic() - started
    finished = [o for o in outcomes if isinstance(o, NativeSessionResult)]
    lags = [lag for result in finished for lag in result.decision_lag_ms]
    grid = finished[0].grid if finished else MINICPMO_GRID
    return {
        "sessions": sessions, "wall_s": round(wall_s, 3), "unit_ms": grid.period_ms,
        "clip_units": clip_units(pcm, grid),
        "units_decided": sum(len(result.decisions) for result in finished),
        "spoken_units": sum(result.decisions.count("speak") for result in finished),
        "late_units": sum(lag > grid.period_ms for lag in lags),
        "responses": sum(len(result.responses) for result in finished),
        "failed_sessions": len(outcomes) - len(finished),
        "failures": [f"{type(o).__name__}: {o}" for o in outcomes if not isinstance(o, NativeSessionResult)],
        "error_events": sum(len(result.errors) for result in finished),
        "decision_lag_ms": summarize(lags),
        "ttfp_ms": summarize(ttfp for result in finished for ttfp in result.ttfp_ms),
        "per_session": [result.summary for result in finished],
    }


def run_benchmark(url: str, levels: Sequence[int], pcm: bytes, opening: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for sessions in levels:
        print(f"  {sessions} session(s) × {len(pcm) / 32000:.1f} s …", file=sys.stderr, flush=True)
        rows.append(asyncio.run(run_level(url, pcm, sessions, opening)))
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [f"{'sessions':>8s} {'units':>7s} {'late':>5s} {'lag p50':>8s} {'lag p95':>8s} {'TTFP p50':>9s} "
             f"{'TTFP p95':>9s} {'errors':>6s}"]
    for row in rows:
        expected = row["sessions"] * row["clip_units"]
        lag, ttfp = row["decision_lag_ms"], row["ttfp_ms"]
        lines.append(f"{row['sessions']:8d} {row['units_decided']:>3d}/{expected:<3d} {row['late_units']:5d} "
                     f"{cell(lag['p50']):>8s} {cell(lag['p95']):>8s} {cell(ttfp['p50']):>9s} "
                     f"{cell(ttfp['p95']):>9s} {row['error_events'] + row['failed_sessions']:6d}")
    return "\n".join(lines)


def write_results(rows: list[dict[str, Any]], settings: dict[str, Any], out_dir: Path) -> list[Path]:
    json_path = write_json(out_dir, "native.json", settings, rows)
    return [json_path, write_plot(rows, out_dir / "native_lag_ttfp_vs_sessions.png")]


def write_plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Decision lag and TTFP (p50, whisker to p95) against the number of concurrent sessions."""
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    sessions = [row["sessions"] for row in rows]
    for axis, key, title in zip(axes, ("decision_lag_ms", "ttfp_ms"),
                                ("decision lag (unit audio sent → decision)", "TTFP (unit audio sent → audio)"),
                                strict=True):
        p50, p95 = percentile_series(rows, key, "p50"), percentile_series(rows, key, "p95")
        axis.errorbar(sessions, p50, yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p95, strict=True)]],
                      marker="o", capsize=4)
        axis.set(title=title, xlabel="concurrent sessions", ylabel="ms", xticks=sessions)
        axis.grid(alpha=0.3)
    axes[0].axhline(rows[0]["unit_ms"], color="grey", linewidth=0.8, linestyle="--")  # one unit period
    return save_figure(figure, path)
