"""Duplex-lane contract points, each checked against a real server: the overlap settings a session
sets are echoed and drive the overlap rules (docs/realtime-api.md §2.3, §13.6); without server VAD
speech_started / speech_stopped frame a committed turn (§13.6) on the turn-based and the native
session; turn.signal (§13.9); every capability key in each session kind's column (§2.6); an event
without a string `type` gets `bad_event` with its `event_id` (§4.0) on all three lanes.

The turn-based cases that matter most run on the torch and the vLLM backends (the vLLM engine is
shared: run this module under `flock /tmp/omni/heavy.lock`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets

from tests.realtime_helpers import MODEL_NAME, Client, append_events, fixture_pcm, running_server, serving
from vllm_omni.client.streaming import append_events as chunked_appends
from vllm_omni.config import load_deploy_config
from vllm_omni.models.registry import load_engine
from vllm_omni.session.base import NativeDuplexSettings

REPO = Path(__file__).resolve().parent.parent
NATIVE_MODEL = "minicpmo-tiny"
TIMEOUT_S = 180.0
COMMIT_FAN_OUT = ["input_audio_buffer.speech_stopped", "conversation.item.added", "conversation.item.created",
                  "input_audio_buffer.committed", "conversation.item.done"]

# The capabilities table, column by column, as the protocol states it
TURN_BASED_CAPABILITIES: dict[str, Any] = {
    "implementation_level": "turn_based_duplex", "chunk_period_ms": 1000,
    "supports_model_native_turn_policy": False, "supports_barge_in": True, "supports_input_append": True,
    "supports_session_resume": True, "supports_session_lease": True, "supports_audio_truncate": True,
    "supports_image_input": True, "supports_text_only_turn": True, "supports_core_resumable_request": False,
    "supports_multi_session": True, "supports_multi_session_same_replica": True,
    "required_input_modalities": ["audio"], "optional_input_modalities": ["video"],
    "session_admission_mode": "engine_managed", "input_modes": ["append_audio_chunk"],
    "adapter_patterns": ["turn_commit"], "signal_sources": ["client_event", "server_policy"],
    "stage_handoff_transport": "scheduler_data_plane", "target_barge_in_latency_ms": None,
    "supports_session_adapter": True, "supports_external_turn_signal": True, "supports_client_commit": True,
    "supports_playback_ack": True, "supports_replace_latest_chunk": False, "supports_reencode_context": True,
    "supports_rollback_to_checkpoint": False, "supports_turn_commit_only": True, "supports_kv_lease": False,
    "supports_core_kv_lease": False, "supports_model_internal_state": False, "supports_stage_resumption": False,
    "supports_scheduler_native_append": False, "supports_concurrent_turn_requests": False,
    "supports_stage_connector_handoff": False, "supports_independent_io_streams": True,
    "supports_realtime_endpoint": True, "requires_model_runner_kv": False, "requires_native_stage_role": False,
}
NATIVE_CAPABILITIES: dict[str, Any] = {
    **TURN_BASED_CAPABILITIES, "implementation_level": "model_native_duplex",
    "supports_model_native_turn_policy": True, "supports_image_input": False, "supports_text_only_turn": False,
    "supports_core_resumable_request": True, "adapter_patterns": ["scheduler_data_plane"],
    "signal_sources": ["model_native", "client_event", "server_policy"], "supports_reencode_context": False,
    "supports_turn_commit_only": False, "supports_model_internal_state": True, "supports_stage_resumption": True,
    "supports_stage_connector_handoff": True, "requires_model_runner_kv": True, "requires_native_stage_role": True,
    "first_chunk_ms": 1030,  # [EXT]: the served model's unit 0 (MiniCPM-o's is 30 ms longer)
}


@pytest.fixture(scope="module")
def torch_duplex(tiny_loaded):
    overrides = {"stages.1.default_sampling_params.max_tokens": 48}
    with running_server(tiny_loaded, overrides, session_mode="duplex") as (url, _, _):
        yield url


@pytest.fixture(scope="module", params=["torch", "vllm"])
def duplex(request):
    """The turn-based duplex deploy on either backend."""
    if request.param == "torch":
        yield request.getfixturevalue("torch_duplex")
        return
    with serving(request.getfixturevalue("vllm_engine"), borrowed=True, session_mode="duplex") as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def turn_mode(tiny_loaded):
    with running_server(tiny_loaded, {}) as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def native(minicpmo_checkpoint):
    engine = load_engine(minicpmo_checkpoint, load_deploy_config(REPO / "configs" / "minicpmo_4_5_tiny_cpu_torch.yaml"))
    with serving(engine, model_name=NATIVE_MODEL, session_mode="duplex",
                 native_duplex=NativeDuplexSettings()) as (url, _, _):
        yield url


async def open_duplex(url: str, **session: Any) -> tuple[Client, dict[str, Any]]:
    """An autostarted duplex session, then `session` applied; the last session object."""
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
    created = (await client.until("session.updated", TIMEOUT_S))[0]
    if not session:
        return client, created["session"]
    await client.send({"type": "session.update", "session": session})
    updated = await client.until(["session.updated", "error"], TIMEOUT_S)
    assert updated[-1]["type"] == "session.updated", updated[-1]
    return client, updated[-1]["session"]


async def until(client: Client, kind: str | list[str]) -> list[dict[str, Any]]:
    """Events up to `kind`; none of them an error."""
    events = await client.until(kind, TIMEOUT_S)
    assert not [e for e in events if e["type"] == "error"], events
    return events


def first_speech_ms(pcm: bytes, chunk_ms: int, floor: float = 0.003) -> int:
    """Where the first append of `chunk_ms` whose RMS reaches `floor` starts."""
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    size = 16 * chunk_ms
    loud = next(i for i in range(0, samples.size, size) if np.sqrt(np.mean(samples[i:i + size] ** 2)) >= floor)
    return loud // 16


def assert_speech_frames_commit(events: list[dict[str, Any]], pcm: bytes, chunk_ms: int) -> None:
    """One speech_started at the first loud append, then the commit fan-out opened by the
    matching speech_stopped at the end of the committed audio, all naming one item."""
    kinds = [e["type"] for e in events]
    started = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    assert len(started) == 1 and started[0]["audio_start_ms"] == first_speech_ms(pcm, chunk_ms), started
    stop = kinds.index("input_audio_buffer.speech_stopped")
    assert stop > kinds.index("input_audio_buffer.speech_started")
    fan_out = [e for e in events[stop:] if e["type"] in COMMIT_FAN_OUT]
    assert [e["type"] for e in events[stop:stop + len(COMMIT_FAN_OUT)]] == COMMIT_FAN_OUT
    item_id = started[0]["item_id"]
    assert fan_out[0]["audio_end_ms"] == len(pcm) // 32
    assert {e.get("item_id") or e["item"]["id"] for e in fan_out} == {item_id}


# Heuristic speech events (docs/realtime-api.md §13.6) --------------------------------------------

async def test_without_server_vad_speech_events_frame_the_committed_turn(duplex) -> None:
    client, _ = await open_duplex(duplex, turn_detection=None)
    pcm = fixture_pcm("speech_en_single.wav")
    await client.send_all(append_events(pcm))
    await client.send({"type": "input_audio_buffer.commit"})
    assert_speech_frames_commit(await until(client, "conversation.item.done"), pcm, 100)
    await client.close()


async def test_the_sessions_silence_floor_judges_speech_and_client_hints_override_it(torch_duplex) -> None:
    client, session = await open_duplex(torch_duplex, overlap_silence_rms=0.5)
    assert session["overlap_silence_rms"] == 0.5
    pcm = fixture_pcm("speech_en_single.wav")
    await client.send_all(append_events(pcm))  # never as loud as 0.5 RMS: no speech, nothing kept
    await client.send({"type": "input_audio_buffer.commit"})
    events = await until(client, "conversation.item.done")
    listens = [e for e in events if e["type"] == "response.listen"]
    assert len(listens) == len(append_events(pcm)) and events[:len(listens)] == listens  # one per append
    fan_out = events[len(listens):]
    assert "input_audio_buffer.speech_started" not in [e["type"] for e in fan_out]
    assert fan_out[0]["type"] == "conversation.item.added"  # no speech_stopped opens the fan-out
    assert fan_out[2]["event"]["empty"] is True and fan_out[2]["event"]["is_speech"] is False  # a silent commit
    appends = append_events(pcm)
    appends[3] = {**appends[3], "is_speech": True, "audio_start_ms": 4321}
    await client.send_all(appends)
    await client.send({"type": "input_audio_buffer.commit"})
    events = await until(client, "conversation.item.done")
    started = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    assert [e["audio_start_ms"] for e in started] == [4321]
    assert events[[e["type"] for e in events].index("input_audio_buffer.speech_stopped") + 1]["item"]["id"] \
        == started[0]["item_id"]
    await client.close()


async def open_native(url: str) -> tuple[Client, dict[str, Any]]:
    """A native auto_response session without server VAD; its session.created."""
    client = await Client.open(f"{url}/v1/realtime?duplex=1")
    await client.send({"type": "session.update", "session": {
        "model": NATIVE_MODEL, "modalities": ["text"], "turn_detection": None, "input_audio_format": "pcm16",
        "extra_body": {"auto_response": True}}})
    return client, (await until(client, "session.updated"))[0]


async def test_a_native_session_frames_its_committed_turn_with_speech_events(native) -> None:
    client, _ = await open_native(native)
    pcm = fixture_pcm("speech_en_single.wav")[: 32 * 2400]
    await client.send_all(chunked_appends(pcm, chunk_ms=200))
    await client.send({"type": "input_audio_buffer.commit"})
    assert_speech_frames_commit(await until(client, "conversation.item.done"), pcm, 200)
    await client.close()


async def test_a_native_sessions_silence_floor_and_turn_signals_are_its_own(native) -> None:
    """The native session takes the same session settings and turn signals as the turn-based one."""
    client, _ = await open_native(native)
    await client.send({"type": "session.update", "session": {"overlap_silence_rms": 0.5}})
    assert (await until(client, "session.updated"))[-1]["session"]["overlap_silence_rms"] == 0.5
    await client.send_all(chunked_appends(fixture_pcm("speech_en_single.wav")[: 32 * 2400], chunk_ms=200))
    await client.send({"type": "turn.signal", "event": "user_started", "event_id": "sig_native"})
    events = await until(client, "turn.event")
    assert "input_audio_buffer.speech_started" not in [e["type"] for e in events]  # never as loud as 0.5 RMS
    assert (events[-1]["event"], events[-1]["turn_state"]) == ("user_started", "user_speaking")
    await client.send({"type": "signal_turn", "event_id": "sig_bad"})
    error = (await client.until("error", TIMEOUT_S))[-1]["error"]
    assert (error["code"], error["event_id"]) == ("bad_event", "sig_bad")
    await client.close()


# Overlap settings (docs/realtime-api.md §2.3, §13.6) ----------------------------------------------

async def test_the_sessions_short_ack_threshold_decides_what_is_a_back_channel(duplex) -> None:
    """1.5 s over an answer is a turn under the default 700 ms, a back-channel under 3000 ms."""
    client, session = await open_duplex(duplex, turn_detection=None, overlap_short_ack_ms=3000,
                                        extra_body={"overlap_barge_in_ms": 2500, "overlap_silence_rms": 0.002})
    assert (session["overlap_short_ack_ms"], session["overlap_barge_in_ms"], session["overlap_silence_rms"]) \
        == (3000, 2500, 0.002)
    speech = fixture_pcm("speech_en_single.wav")
    await client.send_all(append_events(speech))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    answer = (await until(client, "response.created"))[-1]["response"]["id"]
    overlap = speech[32 * 1000: 32 * 2500]
    await client.send_all(append_events(overlap))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await until(client, "input_audio_buffer.committed")
    decisions = [e for e in events if e["type"] == "overlap.decision"]
    assert decisions and all(e["reason"] in ("policy_listen_only", "silence_or_noise") for e in decisions)
    assert events[-1]["event"]["overlap_ack"] is True and events[-1]["event"]["no_response"] is True
    done = [e for e in await until(client, "response.done") if e["type"] == "response.done"]
    assert (done[-1]["response"]["id"], done[-1]["response"]["status"]) == (answer, "completed")
    await client.send({"type": "session.heartbeat"})
    assert "response.created" not in [e["type"] for e in await until(client, "session.heartbeat_ack")]
    await client.close()


# turn.signal (docs/realtime-api.md §13.9) ---------------------------------------------------------

async def test_turn_signals_change_the_turn_state_or_run_their_command(torch_duplex) -> None:
    client, session = await open_duplex(torch_duplex)
    session_id = session["id"]
    await client.send({"type": "turn.signal", "event": "user_started", "event_id": "sig_1"})
    reply = (await until(client, "turn.event"))[-1]
    assert {k: reply[k] for k in ("session_id", "event", "turn_state", "epoch")} == {
        "session_id": session_id, "event": "user_started", "turn_state": "user_speaking", "epoch": 0}
    await client.send({"type": "signal_turn", "event": "assistant_done"})
    assert (await until(client, "turn.event"))[-1]["turn_state"] == "assistant_playing"
    await client.send({"type": "turn.signal", "event": "session.update",
                       "payload": {"session": {"instructions": "Be brief."}}})
    updated = (await until(client, "session.updated"))[-1]["session"]
    assert (updated["instructions"], updated["turn_state"]) == ("Be brief.", "assistant_playing")
    await client.send({"type": "turn.signal", "event": "input.cancel"})
    await until(client, "input_audio_buffer.cleared")
    for signal, code in (({"type": "turn.signal", "event_id": "sig_2"}, "bad_event"),
                         ({"type": "turn.signal", "event": "conversation.item.retrieve", "event_id": "sig_3",
                           "payload": {"item_id": "item_missing"}}, "item_not_found")):
        await client.send(signal)
        error = (await client.until("error", TIMEOUT_S))[-1]["error"]
        assert (error["code"], error["event_id"]) == (code, signal["event_id"])
    await client.close()


# Capabilities (docs/realtime-api.md §2.6) ---------------------------------------------------------

async def test_a_turn_based_duplex_session_reports_its_whole_capabilities_column(torch_duplex) -> None:
    client, session = await open_duplex(torch_duplex)
    assert session["capabilities"] == TURN_BASED_CAPABILITIES
    await client.close()


async def test_a_native_session_reports_its_whole_capabilities_column(native) -> None:
    client, created = await open_native(native)
    assert created["session"]["capabilities"] == NATIVE_CAPABILITIES
    await client.close()


# Events without a type (docs/realtime-api.md §4.0) ------------------------------------------------

UNTYPED = [({"event_id": "evt_untyped"}, "evt_untyped"), ({"type": 7, "event_id": "evt_int"}, "evt_int"),
           ([{"type": "session.heartbeat"}], None)]


async def assert_untyped_events_echo_their_id(client: Client) -> None:
    for untyped, event_id in UNTYPED:
        await client.send(json.dumps(untyped))
        error = (await client.until("error", TIMEOUT_S))[-1]["error"]
        assert (error["code"], error.get("event_id")) == ("bad_event", event_id), error
    await client.send({"type": "session.heartbeat"})
    await until(client, "session.heartbeat_ack")  # the session goes on


async def test_an_event_without_a_type_echoes_its_event_id_on_the_duplex_lane(torch_duplex) -> None:
    client, _ = await open_duplex(torch_duplex)
    await assert_untyped_events_echo_their_id(client)
    await client.close()
    first = await Client.open(f"{torch_duplex}/v1/realtime?duplex=1", extensions=False)
    await first.send({"event_id": "evt_first"})  # as the first message: fatal, with its id
    error = (await first.until("error", TIMEOUT_S))[-1]["error"]
    assert (error["code"], error["event_id"]) == ("bad_event", "evt_first")
    with pytest.raises(websockets.exceptions.ConnectionClosed):
        await first.next(30)
    assert first.ws.close_code == 1008
    await first.close()


async def test_an_event_without_a_type_echoes_its_event_id_on_the_ga_lane_and_is_flat_on_legacy(turn_mode) -> None:
    ga = await Client.open(f"{turn_mode}/v1/realtime")
    await until(ga, "session.created")
    await assert_untyped_events_echo_their_id(ga)
    await ga.close()
    legacy = await Client.open(f"{turn_mode}/v1/realtime")
    await until(legacy, "session.created")
    await legacy.send({"type": "session.update", "model": MODEL_NAME})  # the legacy lane: no reply
    await legacy.send({"event_id": "evt_legacy"})
    error = await legacy.next(TIMEOUT_S)
    assert (error["code"], "event_id" in error, isinstance(error["error"], str)) == ("bad_event", False, True)
    await legacy.close()
