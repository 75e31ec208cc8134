"""Duplex-lane fields where the seed's client (S0, the MiniCPM-o demo client) reads them, against
real servers: a turn-based duplex session on the tiny Qwen3-Omni (torch) with G.711 output, and
a native MiniCPM-o session (docs/realtime-api.md §13): every audio delta carries its `format` and
`sample_rate_hz` at the top level and its cumulative `metadata.audio_duration_ms`; `response.done`
has the stage metrics under `response.metadata.vllm_omni`; and the terminal `session.closed` /
`session.expired` are numbered like every journaled event before them (§13.4)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest

from tests.realtime_helpers import MODEL_NAME, Client, append_events, fixture_pcm, running_server, serving
from tests.test_minicpmo_native_session import voice_url
from vllm_omni.client.native_duplex import native_opening
from vllm_omni.client.streaming import append_events as unit_appends
from vllm_omni.client.streaming import unit_boundary_ms
from vllm_omni.config import load_deploy_config
from vllm_omni.models.registry import load_engine
from vllm_omni.session.base import NativeDuplexSettings

REPO = Path(__file__).resolve().parents[1]
NATIVE_MODEL = "minicpmo-tiny"
DELTA = "response.output_audio.delta"


@pytest.fixture(scope="module", params=["torch", "vllm"])
def turn_server(request):
    """The tiny Qwen3-Omni duplex deploy on torch, or on the shared vLLM engines."""
    if request.param == "vllm":
        with serving(request.getfixturevalue("vllm_engine"), borrowed=True, session_mode="duplex") as (url, _, _):
            yield url
        return
    overrides = {"stages.1.default_sampling_params.max_tokens": 48}
    with running_server(request.getfixturevalue("tiny_loaded"), overrides, session_mode="duplex") as (url, _, _):
        yield url


@pytest.fixture(scope="module", params=["torch", "vllm"])
def native_server(request):
    """The tiny MiniCPM-o 4.5 on configs/minicpmo_4_5_tiny_cpu_torch.yaml, or on the shared vLLM deploy."""
    settings = NativeDuplexSettings(allow_test_decisions=True)
    if request.param == "vllm":
        engine, borrowed = request.getfixturevalue("minicpmo_vllm_engine"), True
    else:
        config = load_deploy_config(REPO / "configs" / "minicpmo_4_5_tiny_cpu_torch.yaml")
        engine, borrowed = load_engine(request.getfixturevalue("minicpmo_checkpoint"), config), False
    with serving(engine, model_name=NATIVE_MODEL, session_mode="duplex", native_duplex=settings,
                 borrowed=borrowed) as (url, _, _):
        yield url


def no_errors(events: list[dict[str, Any]]) -> None:
    assert [e for e in events if e["type"] == "error"] == []


def check_audio_deltas(events: list[dict[str, Any]], fmt: str, rate: int, session_id: str) -> list[dict]:
    """Every delta of the response: top-level format and rate, cumulative duration in `metadata`
    that matches the bytes at that rate, and the other metadata keys; returns the deltas."""
    deltas = [e for e in events if e["type"] == DELTA]
    assert deltas
    assert {(e["format"], e["sample_rate_hz"]) for e in deltas} == {(fmt, rate)}
    bytes_per_sample = 1 if fmt.startswith("g711") else 2
    samples = 0
    for delta in deltas:
        metadata = delta["metadata"]
        samples += len(base64.b64decode(delta["delta"])) // bytes_per_sample
        # cumulative, floor(samples × 1000 / rate) of what arrived (the 24 kHz source may round once more)
        assert abs(metadata["audio_duration_ms"] - samples * 1000 // rate) <= 1, (metadata, samples)
        assert (metadata["session_id"], metadata["model_speak"], metadata["epoch"]) == (session_id, True, 0)
        assert metadata["playback"]["generated_ms"] == metadata["audio_duration_ms"]
        assert isinstance(metadata["end_of_turn"], bool)
    durations = [d["metadata"]["audio_duration_ms"] for d in deltas]
    assert durations == sorted(durations) and durations[-1] > 0
    return deltas


async def close_and_check_numbering(client: Client) -> dict[str, Any]:
    """session.close → session.closed, numbered one above the last event before it, then close 1000."""
    await client.send({"type": "session.close"})
    await client.until("session.closed", timeout=30)
    closed = client.events[-1]
    before = [e["server_event_seq"] for e in client.events[:-1] if "server_event_seq" in e]
    assert before and closed["server_event_seq"] == before[-1] + 1 == max(before) + 1
    assert closed["reason"] == "client_close"
    await asyncio.wait_for(client.ws.wait_closed(), 10)
    assert client.ws.close_code == 1000
    await client.close()
    return closed


async def test_a_g711_turn_based_duplex_session_reports_its_rate_where_s0_reads_it(turn_server) -> None:
    client = await Client.open(f"{turn_server}/v1/realtime?duplex=1&autostart=0", extensions=False)
    await client.send({"type": "session.update", "session": {
        "model": MODEL_NAME, "modalities": ["audio", "text"], "input_audio_format": "pcm16",
        "output_audio_format": "g711_ulaw", "turn_detection": None, "overlap_policy": "listen_only",
        "playback_commit_policy": "ack_only", "extra_body": {}}})
    created, updated = await client.next(), await client.next()
    assert (created["type"], updated["type"]) == ("session.created", "session.updated")
    session_id = created["session"]["id"]
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    turn = await client.until("response.done", timeout=120)
    no_errors(turn)
    check_audio_deltas(turn, "g711_ulaw", 8000, session_id)
    done = turn[-1]["response"]
    assert done["status"] == "completed"
    report = done["metadata"]["vllm_omni"]  # where S0 looks for the engine's token metrics
    assert report["stage_metrics"]["0"]["num_tokens_out"] > 0 and report["stage_metrics"]["0"]["vllm_ttft_ms"] > 0
    assert done["metadata"]["committed"] is False and done["metadata"]["playback"]["played_ms"] == 0  # ack_only
    await close_and_check_numbering(client)
    no_errors(client.events)


async def test_a_native_session_reports_its_units_where_s0_reads_them(native_server) -> None:
    opening = native_opening(model=NATIVE_MODEL, ref_audio=voice_url(),
                             duplex_test_decisions=["listen", "speak", "speak", "speak_end", "listen"])
    client = await Client.open(f"{native_server}/v1/realtime?duplex=1&native_duplex=1&autostart=0")
    await client.send(opening)
    created, updated = await client.next(), await client.next()
    assert (created["type"], updated["type"]) == ("session.created", "session.updated")
    await client.send_all(unit_appends(b"\0\0" * (16 * unit_boundary_ms(4)), chunk_ms=200))
    events = await client.until("response.done", timeout=120)
    no_errors(events)
    deltas = check_audio_deltas(events, "pcm16", 24000, created["session"]["id"])
    metadata = [d["metadata"] for d in deltas]
    assert [m["audio_duration_ms"] for m in metadata][:2] == [1000, 2000]  # one 1 s unit each
    assert [m["end_of_turn"] for m in metadata] == [False, False, True]
    assert [m["audio_text_marks"][0]["audio_end_ms"] for m in metadata] == [m["audio_duration_ms"] for m in metadata]
    thinker = events[-1]["response"]["metadata"]["vllm_omni"]["stage_metrics"]["0"]  # §8.1, §8.2
    assert thinker["num_tokens_out"] >= 3  # at least a token per speaking unit
    assert len(thinker["vllm_itls_ms"]) == thinker["num_tokens_out"] - 1
    assert thinker["vllm_ttft_ms"] > 0 and thinker["vllm_tpot_ms"] > 0
    assert thinker["vllm_tpot_ms"] == pytest.approx(sum(thinker["vllm_itls_ms"]) / len(thinker["vllm_itls_ms"]),
                                                    abs=0.01)
    await client.until("response.listen", timeout=60)  # the last unit
    await close_and_check_numbering(client)
    no_errors(client.events)


async def test_an_expired_session_numbers_its_session_expired(tiny_loaded) -> None:
    with running_server(tiny_loaded, {}, session_mode="duplex", idle_ttl_s=1.0, reaper_interval_s=0.1) as (url, _, _):
        client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
        await client.until("session.expired", timeout=30)
        seqs = [e.get("server_event_seq") for e in client.events]
        assert seqs[0] is None and seqs[1:] == list(range(1, len(seqs)))  # session.created is not numbered
        assert client.events[-1]["reason"] == "idle_ttl_expired"
        await client.close()
