"""The client library's pure parts: URLs, WAV checks, appends with frames, the timing math
(on recorded event streams, including broken fields), and per-response collection."""

from __future__ import annotations

import base64
import math
import struct
import wave
from pathlib import Path

import pytest

from vllm_omni.client import events
from vllm_omni.client.collector import collect
from vllm_omni.client.session_setup import flat_session_update, ga_session_update
from vllm_omni.client.streaming import append_events
from vllm_omni.client.timing import response_metrics, session_summary, summarize
from vllm_omni.client.url import calls_url, realtime_url, with_extensions
from vllm_omni.client.wav import WavError, read_pcm16, wav_data_url, write_pcm16
from vllm_omni.client.webrtc_call import FRAME_MS, HeardFrame, heard_metrics
from vllm_omni.protocol.client_events import SessionSettings, parse_client_event


def test_realtime_url_maps_schemes_and_adds_parameters() -> None:
    assert realtime_url("http://host:8000") == "ws://host:8000/v1/realtime"
    assert realtime_url("https://host/") == "wss://host/v1/realtime"
    assert realtime_url("ws://h:1/v1/realtime", model="m") == "ws://h:1/v1/realtime?model=m"
    url = realtime_url("https://h", model="q o", duplex=True, native_duplex=False, autostart=False, session_id="s1")
    assert url == "wss://h/v1/realtime?model=q+o&duplex=1&native_duplex=0&autostart=0&session_id=s1"
    for bad in ("ftp://h", "h:8000", "file:///x"):
        with pytest.raises(ValueError, match="scheme|host"):
            realtime_url(bad)


def test_the_client_asks_for_the_extensions_once() -> None:
    assert with_extensions("ws://h:1/v1/realtime") == "ws://h:1/v1/realtime?extensions=vllm_omni"
    assert with_extensions("ws://h/v1/realtime?model=m") == "ws://h/v1/realtime?model=m&extensions=vllm_omni"
    asked = "ws://h/v1/realtime?extensions=other,vllm_omni"
    assert with_extensions(asked) == asked


def write_wav(path: Path, channels: int = 1, width: int = 2, rate: int = 16000, frames: int = 1600) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(b"\x01" * frames * channels * width)
    return path


def test_wav_reading_accepts_only_16k_mono_pcm16(tmp_path: Path) -> None:
    assert len(read_pcm16(write_wav(tmp_path / "ok.wav"))) == 3200
    cases = {"stereo": (write_wav(tmp_path / "st.wav", channels=2), "2 channels"),
             "8-bit": (write_wav(tmp_path / "b8.wav", width=1), "8-bit"),
             "44.1k": (write_wav(tmp_path / "hi.wav", rate=44100), "44100 Hz"),
             "empty": (write_wav(tmp_path / "empty.wav", frames=0), "no audio"),
             "missing": (tmp_path / "nope.wav", "no such file")}
    compressed = tmp_path / "float.wav"  # WAVE_FORMAT_IEEE_FLOAT (3): not uncompressed PCM
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 64000, 4, 32)
    compressed.write_bytes(b"RIFF" + struct.pack("<I", 36 + 8) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
                           + b"data" + struct.pack("<I", 8) + b"\0" * 8)
    cases["compressed"] = (compressed, "not an uncompressed PCM WAV")
    for name, (path, message) in cases.items():
        with pytest.raises(WavError, match=message) as caught:
            read_pcm16(path)
        assert "\n" not in str(caught.value), name


def test_wav_round_trip_and_data_url(tmp_path: Path) -> None:
    pcm = struct.pack("<4h", 0, 1000, -1000, 32767)
    write_pcm16(tmp_path / "a.wav", pcm, 16000)
    assert read_pcm16(tmp_path / "a.wav") == pcm
    url = wav_data_url(tmp_path / "a.wav")
    assert url.startswith("data:audio/wav;base64,")
    assert base64.b64decode(url.split(",", 1)[1]).endswith(pcm)


def test_session_updates_in_both_shapes() -> None:
    ga = ga_session_update(model="m", server_vad=True, instructions="hi")
    assert ga["session"]["type"] == "realtime"
    assert ga["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    flat = flat_session_update(model="m", ref_audio="data:audio/wav;base64,AAAA")
    assert flat["session"]["turn_detection"] is None and flat["session"]["input_audio_format"] == "pcm16"
    assert flat["session"]["ref_audio"].startswith("data:")
    plain = ga_session_update()["session"]["audio"]
    assert plain["input"]["turn_detection"] is None and "voice" not in plain["output"]  # null sent, unset left out
    assert "transcription" not in plain["input"]
    asr = ga_session_update(transcription={"model": "m"})["session"]["audio"]["input"]  # bench --compare-transcription
    assert asr["transcription"] == {"model": "m"}


def test_client_events_are_the_protocols_own() -> None:
    """What the client sends parses, field for field, as the server's models of those events."""
    assert events.input_audio_commit() == {"type": "input_audio_buffer.commit"}
    assert events.response_create() == {"type": "response.create"}
    assert events.session_close() == {"type": "session.close"}
    assert events.playback_ack("r1", 640) == {"type": "playback.ack", "response_id": "r1", "item_id": "item_r1",
                                              "played_ms": 640, "committed_ms": 640}
    updates = [ga_session_update(model="m", server_vad=True, voice="Ethan", vad={"threshold": 0.6}),
               flat_session_update(model="m", instructions="hi", ref_audio="data:audio/wav;base64,AAAA")]
    appends = append_events(b"\0\0" * 16 * 1200, frames=[["f0"]])
    assert all(append["sample_rate_hz"] == 16000 for append in appends)  # a GA session's default is 24 kHz
    sent = [*updates, *appends, events.input_audio_commit(),
            events.response_create(), events.playback_ack("r1", 640), events.session_close()]
    for event in sent:
        assert parse_client_event(event).model_dump(exclude_unset=True) == event
    for update in updates:
        SessionSettings.model_validate(update["session"])


def test_frames_ride_the_appends_that_close_model_units() -> None:
    pcm = b"\0\0" * 16 * 3500  # 3.5 s
    frames = [["f0"], ["f1", "f1-stacked"], ["f2"], ["f3"]]
    events = append_events(pcm, chunk_ms=200, frames=frames)
    ends_ms = [200 * (i + 1) for i in range(len(events))]
    carried = {end: e["video_frames"] for end, e in zip(ends_ms, events, strict=True) if "video_frames" in e}
    assert carried == {1200: ["f0"], 2200: ["f1", "f1-stacked"], 3200: ["f2"]}  # 1030 + 1000 k; f3 has no unit
    with pytest.raises(ValueError, match="at most 2"):
        append_events(pcm, frames=[["a", "b", "c"]])


def audio_delta(t: float, ms: float | None, response: str = "r1", size: int = 4800) -> dict:
    """A delta as the server sends it to a client that asked for the extensions."""
    report = {"sample_rate_hz": 24000} if ms is None else {"sample_rate_hz": 24000, "audio_duration_ms": ms}
    return {"type": "response.output_audio.delta", "response_id": response, "_t": t,
            "delta": base64.b64encode(b"\0" * size).decode(), "vllm_omni": report}


def test_response_metrics_on_a_recorded_stream() -> None:
    events = [{"type": "response.created", "response": {"id": "r1"}, "_t": 10.05},
              {"type": "response.output_audio_transcript.delta", "response_id": "r1", "delta": "", "_t": 10.1},
              {"type": "response.output_audio_transcript.delta", "response_id": "r1", "delta": "Hi", "_t": 10.2},
              audio_delta(10.3, 320.0), audio_delta(10.5, 2320.0), audio_delta(10.9, 4320.0),
              {"type": "response.done", "response": {"id": "r1", "status": "completed"}, "_t": 11.0}]
    m = response_metrics(events, t0=10.0)
    assert m["ttft_ms"] == pytest.approx(200) and m["ttfp_ms"] == pytest.approx(300)
    assert m["audio_duration_ms"] == 4320.0 and m["rtf"] == pytest.approx(0.9 / 4.32)
    assert m["chunk_count"] == 3 and m["max_chunk_gap_ms"] == pytest.approx(400)
    assert m["inter_chunk_interval_ms"]["p50"] == pytest.approx(200) and m["chunk_duration_ms"]["max"] == 2000
    assert response_metrics(events, t0=None)["ttfp_ms"] == pytest.approx(250)  # from response.created


def test_broken_fields_are_ignored_not_fatal() -> None:
    events = [audio_delta(1.0, float("nan")), audio_delta(float("inf"), 100.0), audio_delta(1.2, None),
              {"type": "response.output_audio.delta", "response_id": "r1", "_t": 1.3, "delta": "***"},
              {"type": "response.output_audio.delta", "response_id": "r1", "_t": 1.4},
              {"type": "response.output_text.delta", "response_id": "r1", "delta": None, "_t": 1.5},
              {"type": "response.output_audio.delta", "response_id": "r1", "delta": "AAAA", "_t": "late"}]
    m = response_metrics(events, t0=0.5)
    assert m["ttft_ms"] is None and m["ttfp_ms"] == pytest.approx(500)
    assert m["chunk_count"] == 2 and m["audio_duration_ms"] == pytest.approx(200)  # 2 x 4800 bytes at 24 kHz
    empty = response_metrics([], t0=None)
    assert empty["rtf"] is None and empty["ttfp_ms"] is None and empty["chunk_count"] == 0


def test_summaries_use_nearest_rank_and_drop_bad_values() -> None:
    s = summarize([5, 1, 4, 2, 3, -1, float("nan"), None, "x", math.inf, True])
    assert s == {"count": 5, "mean": 3.0, "min": 1.0, "p50": 3.0, "p95": 5.0, "max": 5.0}
    assert summarize([])["p50"] is None
    turns = [{"chunk_count": 2, "ttft_ms": 100.0, "ttfp_ms": 200.0, "rtf": 0.5},
             {"chunk_count": 0, "ttft_ms": 1.0, "ttfp_ms": None, "rtf": None},
             {"chunk_count": 1, "ttft_ms": float("nan"), "ttfp_ms": 400.0, "rtf": 0.25}]
    assert session_summary(turns) == {"audio_turn_count": 2, "mean_ttft_ms": 100.0, "mean_ttfp_ms": 300.0,
                                      "mean_rtf": 0.375}


def test_collector_groups_audio_and_text_by_response() -> None:
    events = [{"type": "session.created"}, audio_delta(1.0, 100.0, "a"), audio_delta(1.1, 100.0, "b", size=96),
              {"type": "response.output_audio_transcript.delta", "response_id": "a", "delta": "he"},
              {"type": "response.output_audio_transcript.delta", "response_id": "a", "delta": "llo"},
              {"type": "error", "error": {"code": "bad_event"}},
              {"type": "response.done", "response": {"id": "a", "status": "completed"}}]
    collected = collect(events)
    assert list(collected.responses) == ["a", "b"]
    assert collected.responses["a"].transcript == "hello" and collected.responses["a"].status == "completed"
    assert len(collected.responses["a"].audio) == 4800 and collected.responses["a"].audio_ms == 100
    assert len(collected.errors) == 1
    legacy = {"type": "response.output_audio.delta", "response_id": "c", "audio": "AAAA", "sample_rate_hz": 16000}
    assert collect([legacy]).responses["c"].sample_rate == 16000  # the legacy lane's top-level rate


def test_calls_url_is_the_v1_realtime_calls_route() -> None:
    assert calls_url("ws://h:1/v1/realtime?model=m") == "http://h:1/v1/realtime/calls"
    assert calls_url("https://h/omni") == "https://h/omni/v1/realtime/calls"


def test_a_call_is_timed_at_the_receiving_track() -> None:
    """TTFP at the first audible frame after `response.created`; a pause of silent frames inside
    the answer's playback is a stall of that length; frames before the answer do not count."""
    t0 = 100.0
    events = [{"type": "response.created", "_t": t0},
              {"type": "response.output_audio_transcript.delta", "delta": "Hi", "_t": t0 + 0.05},
              {"type": "output_audio_buffer.started", "response_id": "r", "_t": t0 + 0.2},
              {"type": "output_audio_buffer.stopped", "response_id": "r", "_t": t0 + 1.0}]
    frame_s = FRAME_MS / 1000
    heard = [HeardFrame(t0 - 0.5, True)]  # the previous answer's last frame
    heard += [HeardFrame(t0 + 0.2 + i * frame_s, not 10 <= i < 15) for i in range(40)]  # 100 ms of silence
    heard += [HeardFrame(t0 + 2.0, True)]  # long after the playback ended (and its tail)
    metrics = heard_metrics(events, heard)
    assert metrics["ttft_ms"] == pytest.approx(50) and metrics["ttfp_ms"] == pytest.approx(200)
    assert metrics["audio_duration_ms"] == 35 * FRAME_MS and metrics["chunk_count"] == 35
    assert metrics["stall_count"] == 1 and metrics["stall_ms"] == pytest.approx(100, abs=1)
    assert metrics["rtf"] is None
    assert heard_metrics([], heard)["ttfp_ms"] is None
