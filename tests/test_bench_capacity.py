"""`vllm-omni bench capacity` against a real server on the tiny checkpoint (torch stages, CPU):
one session measured first, the search up to two, capacity.json and the verdict line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import audio_fixture_path
from tests.realtime_helpers import running_server
from vllm_omni.cli.main import main


def test_bench_capacity_measures_one_session_first_and_prints_the_capacity(tiny_loaded, tmp_path: Path,
                                                                            capsys) -> None:
    overrides = {"stages.1.default_sampling_params.max_tokens": 40}
    with running_server(tiny_loaded, overrides) as (url, _, _):
        code = main(["bench", "capacity", "--url", url.replace("ws://", "http://"), "--max-sessions", "2",
                     "--turns", "1", "--wav", str(audio_fixture_path("speech_en_single.wav")),
                     "--out-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    written = json.loads((tmp_path / "capacity.json").read_text())
    settings, results = written["settings"], written["results"]
    assert settings["arrival_spread_s"] > 5.0  # the question's length (5.08 s)
    assert settings["target"]["max_rtf_p95"] == 1.0 and settings["target"]["max_playable_start_ratio"] == 2.0
    levels = results["levels"]
    assert levels[0]["sessions"] == 1
    assert results["reference_playable_start_p95_ms"] == levels[0]["playable_start_ms"]["p95"] > 0
    for level in levels:
        assert level["error_events"] == 0 and level["failed_sessions"] == 0
        assert level["verdict"] in ("pass", "fail") and (level["verdict"] == "fail") == bool(level["reasons"])
        assert set(level["stalls_at_buffer_ms"]) == {"0", "60", "120"}
        for turn in level["per_turn"]:
            assert turn["playable_start_ms"] == turn["ttfp_ms"] + turn["start_delay_ms"]
            assert set(turn["stalls_at_buffer"]) == {"0", "60", "120"}
    # One session failing ends the search at 0; else two sessions are measured and decide it.
    passed = [level["sessions"] for level in levels if level["verdict"] == "pass"]
    assert [level["sessions"] for level in levels] == ([1, 2] if passed else [1])
    assert results["capacity"] == max(passed, default=0)
    last = out.strip().splitlines()[-1]
    assert re.match(rf"capacity: {results['capacity']} concurrent sessions\b", last), out
    assert "capacity: 1 session(s): " in err and (tmp_path / "capacity.png").stat().st_size > 10_000
