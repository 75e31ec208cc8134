"""`vllm-omni bench realtime`: concurrent realtime sessions against a server and, in the same
run, against a baseline; per concurrency level TTFT / TTFP / playable start / RTF percentiles,
playback stalls (behind 0, 60 and 120 ms playout buffers) and buffer (client/playback.py), audio
seconds produced per wall second and error counts, with every answer's figures and TTFT / TTFP /
playable start by turn number. JSON, a printed table, and a PNG of TTFP, playable start and RTF
against concurrency. Targets on the duplex lane (docs/realtime-api.md §13) also report
their responses and, in a barge-in run, the barge-in reaction time (client/barge_in.py).
Targets over WebRTC calls (§15) are timed at the receiving track (client/webrtc_call.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from pathlib import Path
from typing import Any

from vllm_omni.bench.report import Progress, percentile_series, pyplot, run_levels, save_figure, write_json
from vllm_omni.client.barge_in import CANCELLED, run_barge_in_session
from vllm_omni.client.playback import PLAYOUT_BUFFERS_MS
from vllm_omni.client.timing import summarize
from vllm_omni.client.turns import SessionResult, TurnResult, run_session
from vllm_omni.client.webrtc_call import run_call_session

# An answer's figures in `per_turn`, besides its session, turn number and status.
TURN_KEYS = ("ttft_ms", "ttfp_ms", "playable_start_ms", "start_delay_ms", "rtf", "audio_duration_ms", "stall_count",
             "stall_ms", "min_buffer_ms", "stalls_at_buffer", "stall_ms_at_buffer")


async def timed_gather(runs: Sequence[Awaitable[Any]]) -> tuple[list[Any], float]:
    """The runs' results (or exceptions), run concurrently, and their wall time in seconds."""
    started = time.monotonic()
    outcomes = await asyncio.gather(*runs, return_exceptions=True)
    return outcomes, time.monotonic() - started


def turn_rows(sessions: Sequence[Sequence[tuple[dict[str, Any], str | None]]]) -> list[dict[str, Any]]:
    """One row per answer: its session and turn number (both from 1), `TURN_KEYS` of its
    metrics and its status. `sessions[i]`: session i+1's (metrics, status) per answer, in
    order; empty for a session that failed."""
    return [{"session": session, "turn": turn, **{key: metrics.get(key) for key in TURN_KEYS}, "status": status}
            for session, answers in enumerate(sessions, 1) for turn, (metrics, status) in enumerate(answers, 1)]


def by_turn(per_turn: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """TTFT, TTFP and playable-start summaries per turn number, over the sessions: turn n
    against turn 1."""
    numbers = sorted({row["turn"] for row in per_turn})
    return {number: {key: summarize(row[key] for row in per_turn if row["turn"] == number)
                     for key in ("ttft_ms", "ttfp_ms", "playable_start_ms")} for number in numbers}


def buffered_figures(heard: Sequence[dict[str, Any]], buffer_ms: int) -> dict[str, Any]:
    """The `heard` answers' stalls behind a `buffer_ms` playout buffer (client/playback.py's
    `buffered_stalls`): in all, the answers with one, and the stalled ms in all."""
    stalls = [(row["stalls_at_buffer"] or {}).get(str(buffer_ms), 0) for row in heard]
    stalled_ms = [(row["stall_ms_at_buffer"] or {}).get(str(buffer_ms), 0.0) for row in heard]
    return {"stalls": sum(stalls), "stalled_responses": sum(1 for count in stalls if count),
            "stall_ms": round(sum(stalled_ms), 3)}


def playback_figures(played: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stalls and least buffer over the `played` answers that have audio, and their stalls
    behind each of the playout buffers PLAYOUT_BUFFERS_MS (`stalls_at_buffer_ms`)."""
    heard = [row for row in played if row["audio_duration_ms"]]
    return {"stalls": sum(row["stall_count"] for row in heard),
            "stalled_responses": sum(1 for row in heard if row["stall_count"]),
            "stall_ms": summarize(row["stall_ms"] for row in heard),
            "min_buffer_ms": summarize(row["min_buffer_ms"] for row in heard),
            "stalls_at_buffer_ms": {str(ms): buffered_figures(heard, ms) for ms in PLAYOUT_BUFFERS_MS}}


def level_row(sessions: int, turns: int, wall_s: float, per_turn: Sequence[dict[str, Any]], *, completed: int,
              failures: Sequence[BaseException], error_events: int = 0, lost_audio_turns: int = 0) -> dict[str, Any]:
    """One concurrency level's row: `sessions` of `turns` turns each, `per_turn` the answers
    of the sessions that finished (`turn_rows`). A cancelled answer's generation and playback
    were cut short: its RTF and stalls say nothing."""
    played = [row for row in per_turn if row["status"] != CANCELLED]
    return {
        "sessions": sessions, "turns": sessions * turns, "completed_turns": completed, "wall_s": round(wall_s, 3),
        "failed_sessions": len(failures), "lost_audio_turns": lost_audio_turns, "error_events": error_events,
        "failures": [f"{type(f).__name__}: {f}" for f in failures],
        "audio_s_per_wall_s": round(sum(row["audio_duration_ms"] for row in per_turn) / 1000 / wall_s, 3),
        "ttft_ms": summarize(row["ttft_ms"] for row in per_turn),
        "ttfp_ms": summarize(row["ttfp_ms"] for row in per_turn),
        "playable_start_ms": summarize(row["playable_start_ms"] for row in per_turn),
        "rtf": summarize(row["rtf"] for row in played),
        **playback_figures(played),
        "by_turn": by_turn(per_turn),
        "per_turn": list(per_turn),
    }


def level_runner(run: Callable[..., Coroutine[Any, Any, dict[str, Any]]], url: str, pcm: bytes, turns: int,
                 **options: Any) -> Callable[[int, Progress], dict[str, Any]]:
    """A level as `run_levels` runs it: `run(url, pcm, sessions, turns, on_turn=progress, **options)`
    to completion."""
    return lambda sessions, progress: asyncio.run(run(url, pcm, sessions, turns, on_turn=progress, **options))


def _status(turn: TurnResult) -> str | None:
    return turn.response.status if turn.response is not None else None


async def _after(delay_s: float, run: Awaitable[Any]) -> Any:
    await asyncio.sleep(delay_s)
    return await run


def staggered(runs: Sequence[Awaitable[Any]], arrival_spread_s: float) -> list[Awaitable[Any]]:
    """Run i starts i * spread / len(runs) seconds in (0: all at once)."""
    return [_after(i * arrival_spread_s / len(runs), run) for i, run in enumerate(runs)]


async def run_level(url: str, pcm: bytes, sessions: int, turns: int, *, model: str | None = None,
                    server_vad: bool = False, transcribe: bool = False, duplex: bool = False,
                    interruption: bytes | None = None, arrival_spread_s: float = 0.0, webrtc: bool = False,
                    on_turn: Callable[[TurnResult], None] | None = None) -> dict[str, Any]:
    """`sessions` concurrent sessions of `turns` turns each, audio paced in real time. With
    `interruption` (duplex lane), every turn is a barge-in: `interruption` is spoken over the
    answer, which the server cancels, and is answered in turn. `arrival_spread_s`: session i
    starts i * spread / sessions seconds in (0: all at once, so every turn of every session
    ends at about the same moment, the worst case). `webrtc`: each session is a WebRTC call to
    `url` (the calls URL; server VAD), timed at the receiving track. `on_turn`: called with each
    answer as it ends."""
    if webrtc:
        runs = [run_call_session(url, pcm, turns=turns, model=model, on_turn=on_turn) for _ in range(sessions)]
    elif interruption is not None:
        runs = [run_barge_in_session(url, pcm, interruption, turns=turns, model=model, transcribe=transcribe,
                                     on_turn=on_turn) for _ in range(sessions)]
    else:
        runs = [run_session(url, pcm, turns=turns, model=model, server_vad=server_vad, transcribe=transcribe,
                            duplex=duplex, on_turn=on_turn) for _ in range(sessions)]
    outcomes, wall_s = await timed_gather(staggered(runs, arrival_spread_s))
    finished = [o for o in outcomes if isinstance(o, SessionResult)]
    sessions_turns = [o.turns if isinstance(o, SessionResult) else [] for o in outcomes]
    results = [t for session_turns in sessions_turns for t in session_turns]
    row = level_row(
        sessions, turns, wall_s, turn_rows([[(t.metrics, _status(t)) for t in ts] for ts in sessions_turns]),
        completed=sum(1 for t in results if _status(t) == "completed"),
        failures=[o for o in outcomes if not isinstance(o, SessionResult)],
        error_events=sum(len(result.errors) for result in finished),
        # Audio the client decoded must add up to the server's final cumulative duration (a
        # call's audio is on its track, not in events).
        lost_audio_turns=0 if webrtc else sum(1 for t in results if t.response is not None
                                              and abs(t.response.audio_ms - t.metrics["audio_duration_ms"]) > 1))
    if duplex or interruption is not None:
        row.update({
            "responses": len(results),
            "cancelled_responses": sum(1 for t in results if _status(t) == CANCELLED),
            "barge_in_reaction_ms": summarize(t.barge_in_ms for t in results),
        })
    return row


def run_benchmark(targets: dict[str, str], levels: Sequence[int], pcm: bytes, turns: int, *,
                  model: str | None = None, server_vad: bool = False, transcribed: Collection[str] = (),
                  duplex: Collection[str] = (), interruption: bytes | None = None,
                  arrival_spread_s: float = 0.0, webrtc: Collection[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """For each target (name → URL), each concurrency level in turn; the `transcribed` targets'
    sessions ask for input transcription, the `duplex` ones use the duplex lane (and, with
    `interruption`, barge in on every answer: two responses a turn), the `webrtc` ones are
    WebRTC calls (their URL is the calls URL)."""
    results = {}
    for name, url in targets.items():
        barge_in = interruption if name in duplex else None
        level = level_runner(run_level, url, pcm, turns, model=model, server_vad=server_vad,
                             transcribe=name in transcribed, duplex=name in duplex, interruption=barge_in,
                             arrival_spread_s=arrival_spread_s, webrtc=name in webrtc)
        results[name] = run_levels(name, levels, level, answers_per_session=turns * (1 if barge_in is None else 2),
                                   unit="turns" if barge_in is None else "responses")
    return results


STALLS_HEADER = "stalls@" + "/".join(map(str, PLAYOUT_BUFFERS_MS))


def stalls_cell(row: dict[str, Any]) -> str:
    """A level's stalls behind each playout buffer, e.g. `3/1/0`."""
    return "/".join(str(row["stalls_at_buffer_ms"][str(ms)]["stalls"]) for ms in PLAYOUT_BUFFERS_MS)


def format_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """One line per target and level; `play p50` / `play p95`: the playable start (TTFP plus
    the least start delay that never stalls); `stalls@0/60/120`: playback stalls behind a 0, 60
    and 120 ms playout buffer; `buf min` / `buf p50` are the minimum and median over answers of
    each answer's least buffer (ms); barge-in columns when some target measured barge-ins."""
    def cell(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    barge_in = any(row.get("barge_in_reaction_ms", {}).get("count") for rows in results.values() for row in rows)
    header = (f"{'target':10s} {'sessions':>8s} {'done':>7s} {'errors':>6s} {'TTFT p50':>9s} {'TTFP p50':>9s} "
              f"{'TTFP p95':>9s} {'play p50':>9s} {'play p95':>9s} {'RTF p50':>8s} {'RTF p95':>8s} "
              f"{'audio s/s':>9s} {'lost':>4s} {STALLS_HEADER:>15s} {'buf min':>8s} {'buf p50':>8s}")
    lines = [header + (f" {'barge p50':>9s} {'barge p95':>9s}" if barge_in else "")]
    for name, rows in results.items():
        for row in rows:
            line = (f"{name:10s} {row['sessions']:8d} {row['completed_turns']:>3d}/{row['turns']:<3d} "
                    f"{row['error_events'] + row['failed_sessions']:6d} {cell(row['ttft_ms']['p50']):>9s} "
                    f"{cell(row['ttfp_ms']['p50']):>9s} {cell(row['ttfp_ms']['p95']):>9s} "
                    f"{cell(row['playable_start_ms']['p50']):>9s} {cell(row['playable_start_ms']['p95']):>9s} "
                    f"{cell(row['rtf']['p50'], 3):>8s} {cell(row['rtf']['p95'], 3):>8s} "
                    f"{row['audio_s_per_wall_s']:9.2f} {row['lost_audio_turns']:4d} {stalls_cell(row):>15s} "
                    f"{cell(row['min_buffer_ms']['min']):>8s} {cell(row['min_buffer_ms']['p50']):>8s}")
            if barge_in:
                reaction = row.get("barge_in_reaction_ms", {})
                line += f" {cell(reaction.get('p50')):>9s} {cell(reaction.get('p95')):>9s}"
            lines.append(line)
    return "\n".join(lines)


def write_plot(results: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """TTFP beside the playable start, and RTF (p50 with a p95 whisker), against the number of
    concurrent sessions."""
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = ((axes[0], "ttfp_ms", "-", " TTFP"), (axes[0], "playable_start_ms", "--", " playable start"),
              (axes[1], "rtf", "-", ""))
    for name, rows in results.items():
        sessions = [row["sessions"] for row in rows]
        for axis, key, style, label in panels:
            p50, p95 = percentile_series(rows, key, "p50"), percentile_series(rows, key, "p95")
            axis.errorbar(sessions, p50, yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p95, strict=True)]],
                          marker="o", capsize=4, linestyle=style, label=name + label)
    axes[0].set(title="first audio, playable start (p50, whisker to p95)", xlabel="concurrent sessions", ylabel="ms")
    axes[1].set(title="real-time factor (p50, whisker to p95)", xlabel="concurrent sessions",
                ylabel="generation time / audio duration")
    axes[1].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    levels = sorted({row["sessions"] for rows in results.values() for row in rows})
    for axis in axes:
        axis.set_xticks(levels)
        axis.legend()
        axis.grid(alpha=0.3)
    return save_figure(figure, path)


def write_results(results: dict[str, list[dict[str, Any]]], settings: dict[str, Any], out_dir: Path) -> list[Path]:
    json_path = write_json(out_dir, "results.json", settings, results)
    return [json_path, write_plot(results, out_dir / "ttfp_rtf_vs_sessions.png")]
