"""`vllm-omni client` and `vllm-omni bench realtime` against the real server on the tiny
checkpoint (and, for the bench, the real transformers baseline)."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import pytest

from tests.conftest import audio_fixture_path
from tests.realtime_helpers import running_server
from vllm_omni.cli.main import main


@pytest.fixture(scope="module")
def server_url(tiny_loaded):
    overrides = {"stages.1.default_sampling_params.max_tokens": 40}
    with running_server(tiny_loaded, overrides) as (url, _, _):
        yield url.replace("ws://", "http://")


def test_client_round_trip_writes_a_playable_wav(server_url: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "answer.wav"
    code = main(["client", "--url", server_url, "--wav", str(audio_fixture_path("speech_en_single.wav")),
                 "--out", str(out), "--turns", "2", "--fast"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "turn 1:" in printed and "turn 2:" in printed
    assert "TTFT ms" in printed and "TTFP ms" in printed and "RTF" in printed
    with wave.open(str(out)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
        assert wav.getnframes() > 24000  # two answers of about 3 s each


def test_client_with_server_vad(server_url: str, tmp_path: Path, capsys) -> None:
    code = main(["client", "--url", server_url, "--wav", str(audio_fixture_path("speech_en_single.wav")),
                 "--out", str(tmp_path / "a.wav"), "--server-vad", "--fast", "--model", "qwen3-omni-tiny"])
    assert code == 0, capsys.readouterr()


@pytest.mark.parametrize("problem", ["stereo", "8-bit", "44.1 kHz", "compressed", "missing"])
def test_bad_wavs_get_one_line_errors(problem: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.wav"
    if problem == "compressed":
        path.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x02\x00\x01\x00\x80\x3e\x00\x00"
                         b"\x00\x7d\x00\x00\x02\x00\x04\x00data\x00\x00\x00\x00")  # ADPCM
    elif problem != "missing":
        with wave.open(str(path), "wb") as wav:
            wav.setnchannels(2 if problem == "stereo" else 1)
            wav.setsampwidth(1 if problem == "8-bit" else 2)
            wav.setframerate(44100 if problem == "44.1 kHz" else 16000)
            wav.writeframes(b"\x01" * 3200)
    code = main(["client", "--url", "http://127.0.0.1:9", "--wav", str(path), "--out", str(tmp_path / "o.wav")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_unreachable_server_is_one_line(tmp_path: Path, capsys) -> None:
    code = main(["client", "--url", "http://127.0.0.1:9", "--wav", str(audio_fixture_path("speech_en_single.wav")),
                 "--out", str(tmp_path / "o.wav")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1


def test_bench_refuses_a_negative_arrival_spread(tmp_path: Path, capsys) -> None:
    code = main(["bench", "realtime", "--url", "http://127.0.0.1:9", "--wav",
                 str(audio_fixture_path("speech_en_single.wav")), "--out-dir", str(tmp_path), "--no-baseline",
                 "--arrival-spread-s", "-1"])
    err = capsys.readouterr().err
    assert code == 2 and "--arrival-spread-s must be 0 or more" in err and err.count("\n") == 1


def test_bench_measures_server_and_baseline(server_url: str, tiny_checkpoint: Path, tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "bench"
    code = main(["bench", "realtime", "--url", server_url, "--sessions", "1,2", "--turns", "1",
                 "--wav", str(audio_fixture_path("speech_en_single.wav")), "--out-dir", str(out_dir),
                 "--baseline-model", str(tiny_checkpoint), "--baseline-talker-tokens", "40",
                 "--arrival-spread-s", "0.5"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    written = json.loads((out_dir / "results.json").read_text())
    assert written["settings"]["arrival_spread_s"] == 0.5
    results = written["results"]
    assert set(results) == {"vllm-omni", "baseline"}
    for rows in results.values():
        assert [row["sessions"] for row in rows] == [1, 2]
        for row in rows:
            assert row["completed_turns"] == row["turns"] and row["error_events"] == 0
            assert row["ttfp_ms"]["count"] == row["turns"] and row["rtf"]["p50"] > 0
    assert (out_dir / "ttfp_rtf_vs_sessions.png").stat().st_size > 10_000
    assert "baseline" in printed and "vllm-omni" in printed


def test_bench_over_webrtc_calls_beside_the_websocket(server_url: str, tmp_path: Path, capsys) -> None:
    """`--transport websocket,webrtc`: the same server measured over sockets and over calls in
    one run; the calls' TTFP and stalls are taken at the receiving track."""
    out_dir = tmp_path / "bench"
    code = main(["bench", "realtime", "--url", server_url, "--sessions", "2", "--turns", "2", "--server-vad",
                 "--transport", "websocket,webrtc", "--wav", str(audio_fixture_path("speech_en_single.wav")),
                 "--out-dir", str(out_dir), "--no-baseline"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    written = json.loads((out_dir / "results.json").read_text())
    assert written["settings"]["transports"] == ["websocket", "webrtc"]
    results = written["results"]
    assert set(results) == {"vllm-omni", "vllm-omni/webrtc"}
    for rows in results.values():
        (row,) = rows
        assert row["completed_turns"] == row["turns"] == 4 and row["error_events"] == row["failed_sessions"] == 0
        assert row["ttfp_ms"]["count"] == 4 and row["ttfp_ms"]["min"] > 0
    (call_row,) = results["vllm-omni/webrtc"]
    heard = [turn["audio_duration_ms"] for turn in call_row["per_turn"]]
    assert min(heard) > 1000  # the answers (40 codec frames, 3.2 s) were heard on the track
    assert call_row["rtf"]["count"] == 0 and isinstance(call_row["stalls"], int)
    assert "vllm-omni/webrtc" in printed


@pytest.mark.parametrize("transport, extra, message", [
    ("carrier-pigeon", [], "--transport: expected websocket, webrtc or both"),
    ("webrtc", ["--duplex"], "--transport webrtc: the realtime endpoint's GA lane only"),
])
def test_bench_refuses_a_transport_it_cannot_use(transport: str, extra: list[str], message: str, tmp_path: Path,
                                                 capsys) -> None:
    code = main(["bench", "realtime", "--url", "http://127.0.0.1:9", "--wav",
                 str(audio_fixture_path("speech_en_single.wav")), "--out-dir", str(tmp_path), "--no-baseline",
                 "--transport", transport, *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_events_are_stamped_when_they_arrive_not_when_read(server_url: str) -> None:
    """While a client streams audio it does not read; latencies must still count from arrival."""
    import asyncio
    import time

    from vllm_omni.client.connection import RealtimeConnection
    from vllm_omni.client.url import realtime_url

    async def scenario():
        conn = await RealtimeConnection.open(realtime_url(server_url))
        await asyncio.sleep(1.0)  # session.created arrives meanwhile
        read_at = time.monotonic()
        created = await conn.next()
        assert created["type"] == "session.created" and created["_t"] < read_at  # stamped on read would be later
        await conn.close_session()

    asyncio.run(scenario())
