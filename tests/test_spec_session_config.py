"""Session configuration rules of the protocol (docs/conformance.md §2) on the duplex lane's
wire: the flat S0 shape, patch and atomic-update semantics, the filled turn-detection echo, and
the keys of the session object; plus the one rule only a second served name can show."""

from __future__ import annotations

import pytest

from tests.realtime_helpers import MODEL_NAME, Client, running_server
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.protocol.session_update import apply_session_update

SESSION_KEYS = {"object", "type", "id", "model", "instructions", "output_modalities", "modalities", "audio",
                "turn_detection", "input_audio_format", "output_audio_format", "max_output_tokens", "state",
                "turn_state", "epoch", "turn_id", "active_request_id", "active_response_id", "active_response_turn_id",
                "idle_timeout_s",
                "overlap_policy", "overlap_short_ack_ms", "overlap_barge_in_ms", "overlap_silence_rms",
                "playback_commit_policy", "playback", "capabilities"}
FILLED_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
              "create_response": True, "interrupt_response": True, "idle_timeout_ms": None,
              "min_speech_duration_ms": 96}


@pytest.fixture(scope="module")
def duplex_server(turn_model):
    with running_server(turn_model, {"stages.1.default_sampling_params.max_tokens": 32},
                        session_mode="duplex") as (url, _, _):
        yield url


async def updated(client: Client, session: dict, event_id: str = "u1") -> dict:
    await client.send({"type": "session.update", "event_id": event_id, "session": session})
    event = await client.next(timeout=30)
    assert event["type"] == "session.updated", event
    assert event.get("event_id") != event_id  # success events never echo the client's id
    return event["session"]


async def test_the_duplex_session_object_and_its_updates(duplex_server) -> None:
    """§2.1 flat shape, unknown and obsolete keys ignored; §2.2 patch semantics, atomic
    rejection with the event_id; §2.4 filled echo in both places; §2.6 `extra_body` merged and
    never echoed; §2.7 the session object's keys."""
    client = await Client.open(f"{duplex_server}/v1/realtime?autostart=0")
    await client.send({"type": "session.update", "session": {
        "model": MODEL_NAME, "modalities": ["audio", "text"], "input_audio_format": "pcm16",
        "output_audio_format": "pcm16", "turn_detection": None, "overlap_policy": "listen_only",
        "playback_commit_policy": "ack_only", "extra_body": {"native_duplex": True,
                                                     "playback_commit_policy": "commit_all_on_done"},
        "temperature": 0.7, "instructions": "Be brief.", "session_id": "mine", "idle_timeout_s": 60,
        "x_unknown": {"a": 1}, "input_audio_noise_reduction": {"type": "near_field"}, "include": ["x"],
        "prompt": {"id": "p"}, "tracing": "auto", "metadata": {"k": "v"}}})
    created, opened = await client.next(), await client.next()
    assert (created["type"], opened["type"]) == ("session.created", "session.updated")
    shown = opened["session"]
    assert shown.keys() >= SESSION_KEYS, SESSION_KEYS - shown.keys()
    assert "extra_body" not in shown and shown["id"] != "mine"
    assert (shown["instructions"], shown["idle_timeout_s"]) == ("Be brief.", 60)
    assert shown["playback_commit_policy"] == "commit_all_on_done"  # extra_body wins over the session key
    assert shown["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
    assert (shown["include"], shown["prompt"], shown["tracing"], shown["metadata"]) == (
        ["x"], {"id": "p"}, "auto", {"k": "v"})
    assert shown["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    assert shown["audio"]["output"]["format"]["rate"] == 24000
    assert shown["output_modalities"] == shown["modalities"]
    assert shown["turn_detection"] is None and shown["overlap_policy"] == "listen_only"
    assert (shown["state"], shown["epoch"], shown["turn_id"]) == ("open", 0, 0)
    assert set(shown["playback"]) == {"generated_ms", "sent_ms", "played_ms", "committed_ms"}

    patched = await updated(client, {"turn_detection": {"type": "server_vad"}})
    assert patched["audio"]["input"]["turn_detection"] == patched["turn_detection"] == FILLED_VAD
    assert patched["overlap_policy"] == "barge_in_on_speech" and patched["instructions"] == "Be brief."
    tooled = await updated(client, {"tools": [{"type": "function", "name": "get_weather",
                                               "parameters": {"type": "object"}}]})
    assert [tool["name"] for tool in tooled["tools"]] == ["get_weather"]  # accepted, as on the GA lane
    cleared = await updated(client, {"instructions": None, "turn_detection": None, "extra_body": {"x": 1}})
    assert cleared["instructions"] is None and cleared["turn_detection"] is None and "extra_body" not in cleared

    await client.send({"type": "session.update", "event_id": "bad", "session": {
        "instructions": "changed", "input_audio_format": "mp3"}})
    error = await client.next(timeout=30)
    assert (error["type"], error["error"]["code"], error["error"].get("event_id")) == (
        "error", "unsupported_audio_format", "bad")
    unchanged = await updated(client, {})
    assert unchanged["instructions"] is None  # the rejected update changed nothing
    await client.close()


def test_the_model_cannot_change_to_another_served_one() -> None:
    """§2.2: a different served model → `model_update_unsupported`; an unserved one →
    `model_not_found` (needs two served names, so on the update parser itself)."""
    current = SessionConfig(id="duplex-1", model="tiny")
    served = ["tiny", "other"]
    assert [(p.code, p.param) for p in apply_session_update(current, {"model": "other"}, served).rejected] == [
        ("model_update_unsupported", "model")]
    assert [p.code for p in apply_session_update(current, {"model": "gpt-9"}, served).rejected] == ["model_not_found"]
    assert apply_session_update(current, {"model": "tiny"}, served).rejected == []
