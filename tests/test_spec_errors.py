"""The error cases of the protocol (docs/conformance.md §9) on the duplex lane's wire: each
bad event gets its code, its class, the client's `event_id`, and the session stays usable."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from tests.realtime_helpers import MODEL_NAME, Client, append_events, fixture_pcm, running_server

SILENCE = base64.b64encode(b"\0\0" * 1600).decode()


@pytest.fixture(scope="module")
def duplex_server(turn_model):
    with running_server(turn_model, {"stages.1.default_sampling_params.max_tokens": 32},
                        session_mode="duplex") as (url, _, _):
        yield url


def append(**fields) -> dict:
    return {"type": "input_audio_buffer.append", **fields}


# (name, frame, code, class); a dict frame's event_id must come back in error.event_id.
CASES = [
    ("bad JSON", "{not json", "invalid_json", "invalid_request_error"),
    ("not an object", "[1, 2]", "bad_event", "invalid_request_error"),
    ("no type", {"event_id": "e0"}, "bad_event", "invalid_request_error"),
    ("binary frame", b"\x00\x01", "bad_event", "invalid_request_error"),
    ("unknown type", {"type": "input_audio_buffer.frobnicate", "event_id": "e1"}, "unknown_event",
     "invalid_request_error"),
    ("too large", json.dumps(append(audio="A" * (15 * 1024 * 1024 + 8))), "event_too_large",
     "invalid_request_error"),
    ("bad base64", append(audio="***", event_id="e2"), "bad_audio", "invalid_request_error"),
    ("odd-length PCM16", append(audio=base64.b64encode(b"\1\2\3").decode(), event_id="e3"), "bad_audio",
     "invalid_request_error"),
    ("rate below range", append(audio=SILENCE, sample_rate_hz=4000, event_id="e4"), "bad_event",
     "invalid_request_error"),
    ("fractional rate", append(audio=SILENCE, sample_rate_hz=16000.5, event_id="e5"), "bad_event",
     "invalid_request_error"),
    ("frames on a turn-based model", append(audio=SILENCE, video_frames=["AAAA"], event_id="e6"), "bad_event",
     "invalid_request_error"),
    ("unsupported input format", {"type": "session.update", "event_id": "e7",
                                  "session": {"input_audio_format": "mp3"}}, "unsupported_audio_format",
     "invalid_request_error"),
    ("bad turn detection", {"type": "session.update", "event_id": "e8",
                            "session": {"turn_detection": {"type": "push_to_talk"}}}, "unsupported_turn_detection",
     "invalid_request_error"),
    ("unknown model", {"type": "session.update", "event_id": "e9", "session": {"model": "gpt-9"}},
     "model_not_found", "invalid_request_error"),
    ("commit on an empty buffer", {"type": "input_audio_buffer.commit", "event_id": "e10"},
     "input_audio_buffer_empty", "invalid_request_error"),
    ("cancel without a response", {"type": "response.cancel", "event_id": "e11"}, "response_not_active",
     "invalid_request_error"),
    ("response without input", {"type": "response.create", "event_id": "e12"}, "response_create_without_input",
     "invalid_request_error"),
    ("delete without item_id", {"type": "conversation.item.delete", "event_id": "e13"}, "missing_item_id",
     "invalid_request_error"),
    ("retrieve of an unknown item", {"type": "conversation.item.retrieve", "item_id": "item_nope", "event_id": "e14"},
     "item_not_found", "invalid_request_error"),
    ("truncate of an unknown item", {"type": "conversation.item.truncate", "item_id": "item_nope",
                                     "audio_end_ms": 0, "event_id": "e15"}, "item_not_found", "invalid_request_error"),
    ("text append", {"type": "input.text.append", "text": "hi", "event_id": "e16"}, "native_text_append_unsupported",
     "invalid_request_error"),
    ("non-numeric played_ms", {"type": "playback.ack", "played_ms": "10", "event_id": "e17"}, "bad_event",
     "invalid_request_error"),
    ("ack of a mismatched item", {"type": "playback.ack", "response_id": "resp_a", "item_id": "item_resp_b",
                                  "played_ms": 0, "event_id": "e18"}, "playback_item_mismatch",
     "invalid_request_error"),
    ("ack of an unknown response", {"type": "playback.ack", "response_id": "resp_none", "played_ms": 0,
                                    "event_id": "e19"}, "playback_item_not_found", "invalid_request_error"),
    ("event ack past the head", {"type": "session.event_ack", "server_event_seq": 10**6, "event_id": "e20"},
     "invalid_event_ack", "invalid_request_error"),
    ("late resume", {"type": "session.resume", "session_id": "x", "resume_token": "y", "event_id": "e21"},
     "unsupported_session_resume", "invalid_request_error"),
]


async def test_every_error_case_keeps_the_session(duplex_server) -> None:
    """§9.1 shape and class, §9.2 codes, §9.3 required cases, §9.4 none of these is fatal."""
    client = await Client.open(f"{duplex_server}/v1/realtime?model={MODEL_NAME}")
    assert [(await client.next())["type"] for _ in range(2)] == ["session.created", "session.updated"]
    for name, frame, code, kind in CASES:
        await client.send(frame)
        event = (await client.until("error", timeout=60))[-1]
        error = event["error"]
        assert (error["code"], error["type"]) == (code, kind), name
        assert error["message"] and event["event_id"].startswith("event_"), name
        if isinstance(frame, dict) and "event_id" in frame:
            assert error.get("event_id") == frame["event_id"], name
        await client.send({"type": "session.heartbeat"})
        assert (await client.next(timeout=30))["type"] == "session.heartbeat_ack", name
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit", "create_response": True})
    turn = await client.until("response.done", timeout=120)
    assert "error" not in [e["type"] for e in turn]
    assert turn[-1]["response"]["status"] == "completed"
    await client.close()


async def test_an_active_response_refuses_a_second(duplex_server) -> None:
    """§9.3: `response.create` while one is active → `response_already_active` with the
    `event_id`; the active response completes."""
    client = await Client.open(f"{duplex_server}/v1/realtime?model={MODEL_NAME}")
    await client.until("session.updated")
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit", "create_response": True})
    await client.until("response.created")
    await client.send({"type": "response.create", "event_id": "again"})
    events = await client.until("response.done", timeout=120)
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [(e["code"], e.get("event_id")) for e in errors] == [("response_already_active", "again")]
    assert events[-1]["response"]["status"] == "completed"
    await client.close()


async def test_a_frame_over_the_transport_limit_closes_1009(duplex_server) -> None:
    """§1.7: a frame above 16 MiB is refused by the transport with close code 1009."""
    client = await Client.open(f"{duplex_server}/v1/realtime?model={MODEL_NAME}")
    await client.until("session.updated")
    await client.send(json.dumps(append(audio="A" * (16 * 1024 * 1024 + 64))))
    await asyncio.wait_for(client.ws.wait_closed(), 30)
    assert client.ws.close_code == 1009
    await client.close()
