"""`vllm-omni bench capacity`'s verdicts and search (bench/capacity.py) on levels a fake server
measures: rows built by the realtime bench's own `level_row` from made-up answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.test_playback_model import answer
from vllm_omni.bench.capacity import (
    Target,
    capacity_line,
    doubling,
    failed_because,
    format_table,
    search_capacity,
    write_results,
)
from vllm_omni.bench.realtime import level_row, turn_rows
from vllm_omni.cli.main import main

TARGET = Target()


def fake_row(sessions: int, *, rtf: float | None = 0.5, play: float = 1000.0, failed: int = 0, errors: int = 0,
             lost: int = 0, incomplete: int = 0, stalls_at_120: int = 0) -> dict[str, Any]:
    """A level of `sessions` one-turn sessions, every answer with this RTF and playable start;
    `failed` of them failed, `incomplete` of the rest ended unfinished."""
    finished = sessions - failed
    answers = [[(answer(play, rtf=rtf, buffered=(0, stalls_at_120)), "completed")] for _ in range(finished)]
    return level_row(sessions, 1, 5.0, turn_rows(answers), completed=finished - incomplete,
                     failures=[RuntimeError("refused")] * failed, error_events=errors, lost_audio_turns=lost)


def fake_server(capacity: int, measured: list[int]) -> Callable[[int], dict[str, Any]]:
    """A server whose RTF p95 passes 1 beyond `capacity` sessions; records the levels measured."""
    def measure(sessions: int) -> dict[str, Any]:
        measured.append(sessions)
        return fake_row(sessions, rtf=sessions / (capacity + 0.5))
    return measure


def test_a_level_within_the_target_passes() -> None:
    reference = fake_row(1, play=1000.0)
    assert failed_because(reference, reference, TARGET) == []
    assert failed_because(fake_row(8, rtf=0.999, play=2000.0), reference, TARGET) == []  # the ratio may be 2.0


@pytest.mark.parametrize(("row", "reasons"), [
    (fake_row(4, failed=1), ["1 failed session(s)", "3/4 turns completed"]),  # its turn never ran
    (fake_row(4, errors=2), ["2 error event(s)"]),
    (fake_row(4, lost=1), ["1 turn(s) with lost audio"]),
    (fake_row(4, incomplete=1), ["3/4 turns completed"]),
    (fake_row(4, rtf=1.0), ["RTF p95 1.000 ≥ 1.0"]),
    (fake_row(4, rtf=None), ["no RTF (no audio)"]),
    (fake_row(4, play=2001.0), ["playable start p95 2001 ms is 2.00× one session's (> 2.0×)"]),
])
def test_each_broken_promise_fails_the_level_and_says_why(row: dict[str, Any], reasons: list[str]) -> None:
    assert failed_because(row, fake_row(1, play=1000.0), TARGET) == reasons


def test_the_target_is_configurable() -> None:
    reference = fake_row(1, play=1000.0)
    assert failed_because(fake_row(2, rtf=0.7, play=1400.0), reference, Target(0.6, 1.3)) == [
        "RTF p95 0.700 ≥ 0.6", "playable start p95 1400 ms is 1.40× one session's (> 1.3×)"]


def test_doubling_stops_at_the_largest_level() -> None:
    assert doubling(1, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert doubling(1, 10) == [1, 2, 4, 8, 10]
    assert doubling(3, 3) == [3]


def test_the_search_doubles_until_a_level_fails_then_bisects() -> None:
    measured: list[int] = []
    rows, capacity = search_capacity(fake_server(5, measured), TARGET)
    assert capacity == 5
    assert measured == [1, 2, 4, 8, 6, 5]  # 8 fails; between 4 and 8: 6 fails, 5 passes
    assert [row["verdict"] for row in rows] == ["pass", "pass", "pass", "fail", "fail", "pass"]
    assert [row["sessions"] for row in rows] == measured


@pytest.mark.parametrize(("capacity", "expected"), [(1, [1, 2]), (2, [1, 2, 4, 3]), (7, [1, 2, 4, 8, 6, 7]),
                                                    (40, [1, 2, 4, 8, 16, 32, 64, 48, 40, 44, 42, 41])])
def test_the_search_finds_every_capacity(capacity: int, expected: list[int]) -> None:
    measured: list[int] = []
    assert search_capacity(fake_server(capacity, measured), TARGET)[1] == capacity
    assert measured == expected


def test_one_session_failing_is_capacity_zero_and_nothing_more_is_measured(capsys) -> None:
    measured: list[int] = []
    rows, capacity = search_capacity(fake_server(0, measured), TARGET)
    assert (capacity, measured) == (0, [1])
    assert rows[0]["reasons"] == ["RTF p95 2.000 ≥ 1.0"]
    assert "capacity: 1 session(s): fail (RTF p95 2.000 ≥ 1.0)" in capsys.readouterr().err
    assert capacity_line(0, rows, 64) == "capacity: 0 concurrent sessions (one session already fails the target)"


def test_every_level_passing_is_the_largest_tried() -> None:
    measured: list[int] = []
    rows, capacity = search_capacity(fake_server(100, measured), TARGET, start=4, max_sessions=12)
    assert (capacity, measured) == (12, [1, 4, 8, 12])
    assert capacity_line(capacity, rows, 12).startswith("capacity: 12 concurrent sessions")


def test_a_later_start_bisects_down_to_one_session() -> None:
    measured: list[int] = []
    assert search_capacity(fake_server(2, measured), TARGET, start=8)[1] == 2
    assert measured == [1, 8, 4, 2, 3]


def test_the_playable_start_compares_with_one_session() -> None:
    plays = {1: 1000.0, 2: 1500.0, 4: 2500.0, 3: 2000.0}
    rows, capacity = search_capacity(lambda n: fake_row(n, play=plays[n]), TARGET, max_sessions=4)
    assert capacity == 3 and [row["playable_start_ratio"] for row in rows] == [1.0, 1.5, 2.5, 2.0]


def test_the_table_and_json_keep_every_level(tmp_path: Path) -> None:
    rows, capacity = search_capacity(fake_server(5, []), TARGET)
    rows[1] = {**rows[1], "stalls_at_buffer_ms": fake_row(2, stalls_at_120=2)["stalls_at_buffer_ms"]}
    header, *lines = format_table(rows).splitlines()
    assert header.split() == ["sessions", "verdict", "done", "RTF", "p95", "play", "p95", "ratio", "stalls@120",
                              "failures", "why"]
    assert [line.split()[0] for line in lines] == ["1", "2", "4", "5", "6", "8"]  # by sessions
    assert lines[1].split()[:8] == ["2", "pass", "2/2", "0.364", "1000.0", "1.00", "4", "0"]
    assert lines[4].split()[1] == "fail" and lines[4].endswith("RTF p95 1.091 ≥ 1.0")
    json_path, plot = write_results(rows, capacity, TARGET, {"turns": 1}, tmp_path)
    written = json.loads(json_path.read_text())
    assert written["settings"] == {"turns": 1} and written["results"]["capacity"] == 5
    assert written["results"]["reference_playable_start_p95_ms"] == 1000.0
    assert [level["sessions"] for level in written["results"]["levels"]] == [1, 2, 4, 8, 6, 5]
    assert {"verdict", "reasons", "playable_start_ratio", "rtf", "stalls_at_buffer_ms", "per_turn"} <= \
        set(written["results"]["levels"][0])
    assert plot.name == "capacity.png" and plot.stat().st_size > 10_000


@pytest.mark.parametrize("flags", [["--start", "0"], ["--max-sessions", "2", "--start", "4"], ["--turns", "0"],
                                   ["--arrival-spread-s", "-1"], ["--max-playable-start-ratio", "0.5"]])
def test_bad_settings_are_one_line(flags: list[str], tmp_path: Path, capsys) -> None:
    from tests.conftest import audio_fixture_path

    code = main(["bench", "capacity", "--url", "http://127.0.0.1:9", "--wav",
                 str(audio_fixture_path("speech_en_single.wav")), "--out-dir", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
