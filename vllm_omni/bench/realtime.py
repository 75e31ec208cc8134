"""`vllm-omni bench realtime`: concurrent realtime sessions against a server and, in the same
run, against a baseline; per-turn TTFT / TTFP / RTF percentiles, audio seconds produced per
wall second and error counts per concurrency level. JSON, a printed table, and a PNG of TTFP
and RTF against concurrency."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from vllm_omni.client.timing import summarize
from vllm_omni.client.turns import SessionResult, run_session


async def run_level(url: str, pcm: bytes, sessions: int, turns: int, *, model: str | None = None,
                    server_vad: bool = False, transcribe: bool = False) -> dict[str, Any]:
    """`sessions` concurrent sessions of `turns` turns each, audio paced in real time."""
    started = time.monotonic()
    outcomes = await asyncio.gather(*(run_session(url, pcm, turns=turns, model=model, server_vad=server_vad,
                                                  transcribe=transcribe)
                                      for _ in range(sessions)), return_exceptions=True)
    wall_s = time.monotonic() - started
    finished = [o for o in outcomes if isinstance(o, SessionResult)]
    turn_metrics = [t.metrics for result in finished for t in result.turns]
    completed = sum(1 for result in finished for t in result.turns
                    if t.response is not None and t.response.status == "completed")
    # Audio the client decoded must add up to the server's final cumulative duration.
    lost = sum(1 for result in finished for t in result.turns
               if t.response is not None and abs(t.response.audio_ms - t.metrics["audio_duration_ms"]) > 1)
    return {
        "sessions": sessions, "turns": sessions * turns, "completed_turns": completed, "wall_s": round(wall_s, 3),
        "failed_sessions": len(outcomes) - len(finished), "lost_audio_turns": lost,
        "error_events": sum(len(result.errors) for result in finished),
        "failures": [f"{type(o).__name__}: {o}" for o in outcomes if not isinstance(o, SessionResult)],
        "audio_s_per_wall_s": round(sum(m["audio_duration_ms"] for m in turn_metrics) / 1000 / wall_s, 3),
        "ttft_ms": summarize(m["ttft_ms"] for m in turn_metrics),
        "ttfp_ms": summarize(m["ttfp_ms"] for m in turn_metrics),
        "rtf": summarize(m["rtf"] for m in turn_metrics),
    }


def run_benchmark(targets: dict[str, str], levels: Sequence[int], pcm: bytes, turns: int, *,
                  model: str | None = None, server_vad: bool = False,
                  transcribed: Collection[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """For each target (name → URL), each concurrency level in turn; the `transcribed` targets'
    sessions ask for input transcription."""
    return {name: [asyncio.run(run_level(url, pcm, sessions, turns, model=model, server_vad=server_vad,
                                         transcribe=name in transcribed))
                   for sessions in levels] for name, url in targets.items()}


def format_table(results: dict[str, list[dict[str, Any]]]) -> str:
    def cell(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    header = (f"{'target':10s} {'sessions':>8s} {'done':>7s} {'errors':>6s} {'TTFT p50':>9s} {'TTFP p50':>9s} "
              f"{'TTFP p95':>9s} {'RTF p50':>8s} {'RTF p95':>8s} {'audio s/s':>9s} {'lost':>4s}")
    lines = [header]
    for name, rows in results.items():
        for row in rows:
            lines.append(
                f"{name:10s} {row['sessions']:8d} {row['completed_turns']:>3d}/{row['turns']:<3d} "
                f"{row['error_events'] + row['failed_sessions']:6d} {cell(row['ttft_ms']['p50']):>9s} "
                f"{cell(row['ttfp_ms']['p50']):>9s} {cell(row['ttfp_ms']['p95']):>9s} "
                f"{cell(row['rtf']['p50'], 3):>8s} {cell(row['rtf']['p95'], 3):>8s} "
                f"{row['audio_s_per_wall_s']:9.2f} {row['lost_audio_turns']:4d}")
    return "\n".join(lines)


def write_plot(results: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """TTFP and RTF (p50 with a p95 whisker) against the number of concurrent sessions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in results.items():
        sessions = [row["sessions"] for row in rows]
        for axis, key in zip(axes, ("ttfp_ms", "rtf"), strict=True):
            p50 = [row[key]["p50"] if row[key]["p50"] is not None else float("nan") for row in rows]
            p95 = [row[key]["p95"] if row[key]["p95"] is not None else float("nan") for row in rows]
            axis.errorbar(sessions, p50, yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p95, strict=True)]],
                          marker="o", capsize=4, label=name)
    axes[0].set(title="time to first audio (p50, whisker to p95)", xlabel="concurrent sessions", ylabel="ms")
    axes[1].set(title="real-time factor (p50, whisker to p95)", xlabel="concurrent sessions",
                ylabel="generation time / audio duration")
    axes[1].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    levels = sorted({row["sessions"] for rows in results.values() for row in rows})
    for axis in axes:
        axis.set_xticks(levels)
        axis.legend()
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_results(results: dict[str, list[dict[str, Any]]], settings: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps({"settings": settings, "results": results}, indent=2))
    return [json_path, write_plot(results, out_dir / "ttfp_rtf_vs_sessions.png")]
