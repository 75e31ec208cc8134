"""What a listener hears (client/playback.py) on hand-made chunk and event lists, and where it
shows: `response_metrics`, the chat client's turns, the bench's rows, table and progress lines,
and the client's per-turn table."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace
from typing import Any

import pytest

from tests.test_client_units import audio_delta
from vllm_omni.bench.realtime import format_table, level_row, turn_rows, write_plot
from vllm_omni.bench.report import Progress, run_levels
from vllm_omni.cli.client_cmd import format_turns
from vllm_omni.client.chat import ChatTurn, _collect
from vllm_omni.client.playback import buffered_stalls, playback_metrics, start_delay_ms
from vllm_omni.client.timing import response_metrics

PLAIN = ("stall_count", "stall_ms", "min_buffer_ms")  # the player that starts at the first chunk


def plain(heard: dict[str, Any]) -> dict[str, Any]:
    return {key: heard[key] for key in PLAIN}


def test_chunks_that_arrive_ahead_never_stall() -> None:
    # 200 ms of audio every 100 ms: the queue grows by 100 ms a chunk.
    heard = playback_metrics([(0.0, 200.0), (100.0, 200.0), (200.0, 200.0), (300.0, 200.0)], ttfp_ms=400.0)
    assert plain(heard) == {"stall_count": 0, "stall_ms": 0.0, "min_buffer_ms": 100.0}
    assert heard["start_delay_ms"] == 0.0 and heard["playable_start_ms"] == 400.0
    assert heard["stalls_at_buffer"] == {"0": 0, "60": 0, "120": 0}


def test_a_late_chunk_stalls_once_for_as_long_as_it_was_late() -> None:
    # 100 ms plays out at 100; the next arrives at 350 (250 ms of silence), then playback runs to 450.
    heard = playback_metrics([(0.0, 100.0), (350.0, 100.0), (400.0, 100.0), (480.0, 100.0)])
    assert heard["stall_count"] == 1 and heard["stall_ms"] == pytest.approx(250.0)
    assert heard["min_buffer_ms"] == 0.0  # empty when the late chunk came
    later = playback_metrics([(0.0, 100.0), (350.0, 100.0), (400.0, 100.0), (600.0, 100.0)])
    assert later["stall_count"] == 2 and later["stall_ms"] == pytest.approx(250.0 + 50.0)  # dry at 550


def test_min_buffer_is_the_least_queued_before_each_chunk() -> None:
    # Queued ahead when chunks 2..4 arrive: 300 - 50 = 250, 600 - 500 = 100, 900 - 520 = 380.
    heard = playback_metrics([(0.0, 300.0), (50.0, 300.0), (500.0, 300.0), (520.0, 300.0)])
    assert heard["min_buffer_ms"] == pytest.approx(100.0) and heard["stall_count"] == 0


def test_clock_noise_under_a_millisecond_is_no_stall() -> None:
    assert playback_metrics([(0.0, 100.0), (100.9, 100.0)])["stall_count"] == 0
    assert playback_metrics([(0.0, 100.0), (101.5, 100.0)])["stall_count"] == 1


def test_fewer_than_two_chunks_have_no_min_buffer() -> None:
    assert plain(playback_metrics([])) == {"stall_count": 0, "stall_ms": 0.0, "min_buffer_ms": None}
    assert plain(playback_metrics([(5.0, 100.0)])) == {"stall_count": 0, "stall_ms": 0.0, "min_buffer_ms": None}
    silent = playback_metrics([], ttfp_ms=None)
    assert silent["start_delay_ms"] is None and silent["playable_start_ms"] is None
    assert silent["stalls_at_buffer"] == {"0": 0, "60": 0, "120": 0}
    assert playback_metrics([(5.0, 100.0)], ttfp_ms=300.0)["playable_start_ms"] == 300.0


def test_the_start_delay_is_the_latest_a_chunk_comes_behind_the_playhead() -> None:
    # Behind a player started at the first arrival: 0, 350 - 100, 400 - 200, 480 - 300 ms.
    late = [(0.0, 100.0), (350.0, 100.0), (400.0, 100.0), (480.0, 100.0)]
    assert start_delay_ms(late) == pytest.approx(250.0)
    heard = playback_metrics(late, ttfp_ms=700.0)
    assert heard["start_delay_ms"] == pytest.approx(250.0) and heard["playable_start_ms"] == pytest.approx(950.0)
    # The worst chunk need not be the first late one: 150 - 100 = 50, then 400 - 200 = 200.
    assert start_delay_ms([(0.0, 100.0), (150.0, 100.0), (400.0, 100.0)]) == pytest.approx(200.0)
    # Another clock, the same answer.
    assert start_delay_ms([(10_000.0 + a, d) for a, d in late]) == pytest.approx(250.0)


@pytest.mark.parametrize("chunks", [
    [(0.0, 100.0), (350.0, 100.0), (400.0, 100.0), (480.0, 100.0)],
    [(0.0, 57.0), (90.0, 40.0), (95.0, 40.0), (300.0, 200.0), (640.0, 80.0), (700.0, 10.0)],
    [(3.0, 20.0), (80.0, 20.0), (81.0, 20.0), (82.0, 20.0), (200.0, 20.0)],
])
def test_a_player_started_after_the_start_delay_never_stalls_and_one_started_sooner_does(chunks) -> None:
    delay = start_delay_ms(chunks)
    (first, duration), rest = chunks[0], chunks[1:]
    assert playback_metrics([(first + delay, duration), *rest])["stall_count"] == 0
    assert playback_metrics([(first + delay - 2.0, duration), *rest])["stall_count"] == 1


def test_a_start_delay_within_clock_noise_is_none() -> None:
    assert start_delay_ms([(0.0, 100.0), (100.9, 100.0)]) == 0.0
    assert start_delay_ms([(0.0, 100.0), (101.5, 100.0)]) == pytest.approx(1.5)
    assert start_delay_ms([]) is None


# 40 ms chunks every 40 ms, but a hole: none between 80 and 200 ms.
HOLE = [(0.0, 40.0), (40.0, 40.0), (80.0, 40.0), (200.0, 40.0), (240.0, 40.0), (280.0, 40.0)]


def test_a_playout_buffer_rides_out_a_hole_it_covers() -> None:
    # 0 ms: plays from 0, dry at 120, silent until the chunk at 200.
    assert buffered_stalls(HOLE, 0) == (1, pytest.approx(80.0))
    # 60 ms: starts at 40 (80 ms held), dry at 160; rebuffers 60 ms: 40 at 200, 80 at 240 → plays on at 240.
    assert buffered_stalls(HOLE, 60) == (1, pytest.approx(80.0))
    # 120 ms: starts at 80 (120 ms held), dry at 200 just as the next chunk arrives: no stall.
    assert buffered_stalls(HOLE, 120) == (0, 0.0)
    heard = playback_metrics(HOLE)
    assert heard["stalls_at_buffer"] == {"0": 1, "60": 1, "120": 0}
    assert heard["stall_ms_at_buffer"] == {"0": pytest.approx(80.0), "60": pytest.approx(80.0), "120": 0.0}


def test_a_buffering_player_starts_or_resumes_when_the_answer_ends() -> None:
    assert buffered_stalls([(0.0, 30.0), (50.0, 20.0)], 120) == (0, 0.0)  # never 120 ms held: starts at 50
    # Plays 0-200, dry at 200; the last chunk (30 ms, under the buffer) arrives at 300 and plays.
    assert buffered_stalls([(0.0, 200.0), (300.0, 30.0)], 120) == (1, pytest.approx(100.0))
    # Two stalls, each rebuffering 60 ms: dry at 100, plays on at 260 (60 ms held), dry at 320; the last at 500.
    twice = [(0.0, 100.0), (200.0, 30.0), (260.0, 30.0), (500.0, 10.0)]
    assert buffered_stalls(twice, 60) == (2, pytest.approx(160.0 + 180.0))
    assert buffered_stalls([], 60) == (0, 0.0)


@pytest.mark.parametrize("chunks", [
    HOLE, [(0.0, 100.0), (350.0, 100.0), (400.0, 100.0), (600.0, 100.0)], [(0.0, 100.0), (100.9, 100.0)]])
def test_without_a_buffer_the_buffering_player_is_the_plain_one(chunks) -> None:
    heard = playback_metrics(chunks)
    assert buffered_stalls(chunks, 0) == (heard["stall_count"], pytest.approx(heard["stall_ms"]))


def test_response_metrics_plays_the_cumulative_durations_when_the_server_sends_them() -> None:
    # Each delta carries 100 ms of bytes (4800 at 24 kHz), the server says 200 ms each.
    marked = [audio_delta(10.0, 200.0), audio_delta(10.15, 400.0), audio_delta(10.3, 600.0)]
    m = response_metrics(marked, t0=9.9)
    assert (m["stall_count"], m["stall_ms"]) == (0, 0.0)
    assert m["min_buffer_ms"] == pytest.approx(50.0)  # 200 - 150 ms, then 400 - 300
    # Without the marks, the bytes say 100 ms each: dry at 10.1, 10.25 → two 50 ms stalls.
    plain = response_metrics([audio_delta(t, None) for t in (10.0, 10.15, 10.3)], t0=9.9)
    assert plain["stall_count"] == 2 and plain["stall_ms"] == pytest.approx(100.0)
    assert plain["min_buffer_ms"] == 0.0


def test_byte_durations_follow_the_sample_rate_and_fill_missing_marks() -> None:
    slow = audio_delta(10.0, None)
    slow["vllm_omni"]["sample_rate_hz"] = 16000  # 4800 bytes: 150 ms
    m = response_metrics([slow, audio_delta(10.12, None)], t0=10.0)
    assert m["min_buffer_ms"] == pytest.approx(30.0) and m["stall_count"] == 0
    # A delta without a mark between two with: its bytes count, and the next mark covers it.
    mixed = response_metrics([audio_delta(1.0, 100.0), audio_delta(1.1, None), audio_delta(1.2, 300.0)], t0=1.0)
    assert mixed["chunk_duration_ms"]["min"] == mixed["chunk_duration_ms"]["max"] == 100.0
    assert mixed["chunk_duration_ms"]["count"] == 3


def test_the_chat_client_reports_the_same_playback_keys() -> None:
    def chunk(pcm: bytes) -> SimpleNamespace:
        audio = {"id": "a", "transcript": None, "data": base64.b64encode(pcm).decode()}
        return SimpleNamespace(usage=None, choices=[SimpleNamespace(delta=SimpleNamespace(content=None, audio=audio),
                                                                    finish_reason=None)])

    async def stream():
        for pcm in (b"\0" * 4800, b"\0" * 9600):
            yield chunk(pcm)

    collected = ChatTurn(model="m")
    asyncio.run(_collect(stream(), collected, 0.0))
    assert [duration for _, duration in collected.chunks] == [100.0, 200.0] and collected.chunk_count == 2
    late = ChatTurn(model="m", pcm=b"\0" * 9600, chunks=[(100.0, 100.0), (350.0, 100.0)])
    assert {k: late.metrics[k] for k in ("stall_count", "stall_ms", "min_buffer_ms")} == \
        {"stall_count": 1, "stall_ms": 150.0, "min_buffer_ms": 0.0}


def answer(ttfp: float, *, stalls: int = 0, stall_ms: float = 0.0, min_buffer: float | None = None,
           audio_ms: float = 2000.0, rtf: float | None = 0.5, delay: float = 0.0,
           buffered: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """An answer's metrics; `buffered`: its stalls behind the 60 and 120 ms playout buffers
    (each 10 ms long)."""
    at_buffer = {"0": stalls, "60": buffered[0], "120": buffered[1]}
    return {"ttft_ms": ttfp / 2, "ttfp_ms": ttfp, "playable_start_ms": ttfp + delay, "start_delay_ms": delay,
            "rtf": rtf, "audio_duration_ms": audio_ms, "chunk_count": 3, "stall_count": stalls, "stall_ms": stall_ms,
            "min_buffer_ms": min_buffer, "stalls_at_buffer": at_buffer,
            "stall_ms_at_buffer": {"0": stall_ms, "60": buffered[0] * 10.0, "120": buffered[1] * 10.0}}


def bench_row() -> dict[str, Any]:
    sessions = [[(answer(100.0, stalls=2, stall_ms=300.0, min_buffer=0.0, delay=300.0, buffered=(2, 1)), "completed"),
                 (answer(900.0, stalls=5, stall_ms=999.0, min_buffer=0.0, rtf=9.0, buffered=(5, 5)), "cancelled"),
                 (answer(300.0, min_buffer=80.0, delay=20.0), "completed")],
                [],  # a session that failed
                [(answer(200.0, min_buffer=40.0, buffered=(1, 0)), "completed"),
                 (answer(400.0, audio_ms=0.0, rtf=None, buffered=(3, 3)), "incomplete")]]
    return level_row(3, 3, 10.0, turn_rows(sessions), completed=4, failures=[RuntimeError("boom")])


def test_level_rows_count_stalls_of_the_answers_heard_to_the_end() -> None:
    row = bench_row()
    assert (row["stalls"], row["stalled_responses"]) == (2, 1)  # the cancelled answer's 5 do not count
    assert row["stall_ms"]["count"] == 3 and row["stall_ms"]["max"] == 300.0  # with audio, not cancelled
    assert (row["min_buffer_ms"]["min"], row["min_buffer_ms"]["p50"], row["min_buffer_ms"]["max"]) == (0.0, 40.0, 80.0)
    assert row["rtf"]["count"] == 3 and row["rtf"]["max"] == 0.5
    assert row["ttfp_ms"]["count"] == 5
    # Behind each playout buffer, the same answers: 0 ms is the plain player.
    assert row["stalls_at_buffer_ms"] == {"0": {"stalls": 2, "stalled_responses": 1, "stall_ms": 300.0},
                                          "60": {"stalls": 3, "stalled_responses": 2, "stall_ms": 30.0},
                                          "120": {"stalls": 1, "stalled_responses": 1, "stall_ms": 10.0}}


def test_level_rows_summarize_the_playable_start_like_ttfp() -> None:
    row = bench_row()  # playable starts: 400, 900, 320, 200, 400
    assert row["playable_start_ms"]["count"] == 5
    assert (row["playable_start_ms"]["p50"], row["playable_start_ms"]["p95"]) == (400.0, 900.0)
    assert row["by_turn"][1]["playable_start_ms"]["mean"] == 300.0  # (400 + 200) / 2
    assert row["by_turn"][3]["playable_start_ms"]["p50"] == 320.0


def test_level_rows_keep_every_answer_and_summarize_by_turn_number() -> None:
    row = bench_row()
    assert [(t["session"], t["turn"], t["status"]) for t in row["per_turn"]] == [
        (1, 1, "completed"), (1, 2, "cancelled"), (1, 3, "completed"), (3, 1, "completed"), (3, 2, "incomplete")]
    assert row["per_turn"][0] == {"session": 1, "turn": 1, "ttft_ms": 50.0, "ttfp_ms": 100.0,
                                  "playable_start_ms": 400.0, "start_delay_ms": 300.0, "rtf": 0.5,
                                  "audio_duration_ms": 2000.0, "stall_count": 2, "stall_ms": 300.0,
                                  "min_buffer_ms": 0.0, "stalls_at_buffer": {"0": 2, "60": 2, "120": 1},
                                  "stall_ms_at_buffer": {"0": 300.0, "60": 20.0, "120": 10.0}, "status": "completed"}
    assert sorted(row["by_turn"]) == [1, 2, 3]
    assert row["by_turn"][1]["ttfp_ms"]["count"] == 2 and row["by_turn"][1]["ttfp_ms"]["mean"] == 150.0
    assert row["by_turn"][2]["ttft_ms"]["max"] == 450.0 and row["by_turn"][3]["ttfp_ms"]["p50"] == 300.0


def test_the_table_shows_playable_start_stalls_and_buffer() -> None:
    header, line = format_table({"vllm-omni": [bench_row()]}).splitlines()
    assert header.split()[-6:] == ["lost", "stalls@0/60/120", "buf", "min", "buf", "p50"]
    assert line.split()[-4:] == ["0", "2/3/1", "0.0", "40.0"]
    assert header.split()[10:14] == ["play", "p50", "play", "p95"] and line.split()[7:9] == ["400.0", "900.0"]


def test_the_plot_draws_the_playable_start(tmp_path) -> None:
    assert write_plot({"vllm-omni": [bench_row()]}, tmp_path / "p.png").stat().st_size > 10_000


def test_the_client_table_shows_stalls_and_buffer() -> None:
    m = response_metrics([audio_delta(10.0, 100.0), audio_delta(10.35, 200.0), audio_delta(10.4, 300.0)], t0=9.5)
    header, line = format_turns([m])
    assert header.split()[-6:] == ["stalls", "stall", "ms", "min", "buf", "ms"]
    assert line.split()[-3:] == ["1", "250.0", "0.0"]


def test_progress_prints_at_most_once_a_second_and_always_the_last(capsys) -> None:
    ticks = iter([0.0, 0.4, 0.9, 1.2, 1.5])
    progress = Progress("x: 2 session(s)", 5, clock=lambda: next(ticks))
    for ttfp in (812.4, 700.0, 650.0, None, 640.0):
        progress(SimpleNamespace(metrics={"ttfp_ms": ttfp}))
    assert capsys.readouterr().err.splitlines() == [
        "x: 2 session(s): 1/5 turns done (TTFP last 812 ms)",
        "x: 2 session(s): 4/5 turns done (TTFP last -)",
        "x: 2 session(s): 5/5 turns done (TTFP last 640 ms)"]


def test_run_levels_gives_each_level_its_progress(capsys) -> None:
    def level(sessions: int, progress: Progress) -> dict[str, Any]:
        for _ in range(progress.total):
            progress(SimpleNamespace(metrics={"ttfp_ms": 5.0}))
        return {"completed_turns": progress.done, "turns": progress.total, "wall_s": 0.1}

    rows = run_levels("t", [1, 2], level, answers_per_session=3, unit="responses")
    assert [row["turns"] for row in rows] == [3, 6]
    err = capsys.readouterr().err
    assert "t: 2 session(s): 6/6 responses done (TTFP last 5 ms)" in err and "6/6 turns completed" in err
