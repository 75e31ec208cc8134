"""The native duplex lane (MiniCPM-o 4.5, docs/realtime-api.md §13.7-13.8) against the protocol's
contract, through a real server on the tiny checkpoint's vLLM deploy: appends of any size up
to the pending-input cap, silent commits, the response options a commit-driven session refuses,
server-owned opening keys and the `video_frames` checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tests.test_minicpmo_native_session as native
from tests.realtime_helpers import Client, fixture_pcm
from vllm_omni.client.native_duplex import UNIT_EVENTS
from vllm_omni.client.streaming import append_events
from vllm_omni.session.native_units import Piece, UnitAssembler

server = native.server  # the same module-scoped server on the shared vLLM engine
MODEL = native.MODEL


def unit_record(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """What the model decided, unit by unit: the kind, and the listen's reason or the words said."""
    return [(e["type"], e.get("delta") or e.get("response", {}).get("metadata", {}).get("reason", ""))
            for e in events if e["type"] in UNIT_EVENTS]


async def nothing_more(client: Client) -> None:
    """Nothing else is decided or sent: the next event answers a heartbeat."""
    await client.send({"type": "session.heartbeat"})
    event = await client.next()
    assert event["type"] == "session.heartbeat_ack", event


async def burst(url: str, chunk_ms: int) -> list[tuple[str, str]]:
    """5 s of speech in `chunk_ms` appends, sent back to back with no pacing."""
    client = await native.open_session(url, duplex_test_decisions=["listen", "listen", "speak_end", "listen"])
    appends = append_events(fixture_pcm("speech_en_single.wav")[: 32 * 5000], chunk_ms=chunk_ms)
    assert len(appends) == 5000 // chunk_ms
    await client.send_all(appends)
    events = await native.decisions(client, 4)  # units closing at 1030, 2030, 3030 and 4030 ms
    await nothing_more(client)
    await client.close_session()
    return unit_record(events)


async def test_a_burst_of_small_appends_decides_each_unit_once_as_paced_appends_do(server) -> None:
    """§1.7 (the pending-input cap is in bytes), §3.2, §6.1: 250 appends of 20 ms go through and
    decide the units they close, exactly as the same audio in 200 ms appends does."""
    url, _ = server
    small, large = await burst(url, 20), await burst(url, 200)
    assert [kind for kind, _ in small] == ["response.listen", "response.listen", "response.output_text.delta",
                                           "response.listen"]
    assert small == large


async def test_a_commit_without_speech_since_the_last_records_an_empty_turn_only(server) -> None:
    """§3.3 silent commit, §5.5, §6.6: the model gets no padded unit; an empty committed item and
    `response.listen{silence_or_noise}` follow the commit."""
    url, _ = server
    client = await native.open_session(url, duplex_test_decisions=["listen"] * 8)
    await client.send_all(append_events(native.speech_pcm(2)[: 32 * 1500], chunk_ms=100))
    await client.send({"type": "input_audio_buffer.commit"})
    spoken = await native.decisions(client, 2)  # unit 0, and the residual padded into unit 1
    assert "input_audio_buffer.committed" in [e["type"] for e in spoken]
    await client.send_all(append_events(native.silence_pcm(1500), chunk_ms=100))  # unit 2 closes in it
    await native.decisions(client, 1)
    await client.send({"type": "input_audio_buffer.commit", "event_id": "quiet"})
    events = await client.until("response.listen")
    assert [e["type"] for e in events] == ["conversation.item.added", "conversation.item.created",
                                           "input_audio_buffer.committed", "conversation.item.done",
                                           "response.listen"]
    committed = events[2]["event"]
    assert committed["empty"] is True and committed["no_response"] is True and committed["is_speech"] is False
    assert events[3]["item"]["content"] == [{"type": "input_audio", "transcript": "", "is_speech": False}]
    assert events[-1]["response"]["metadata"]["reason"] == "silence_or_noise" and "response_id" not in events[-1]
    await nothing_more(client)  # the residual was not padded into a unit
    await client.close_session()


async def test_response_create_overrides_are_refused_in_a_commit_driven_session(server) -> None:
    """§3.9, §9.2: generation overrides answer `unsupported_native_response_options` naming
    them, and no response starts; the session goes on and answers a plain response.create."""
    url, _ = server
    client = await native.open_session(url, auto_response=False, duplex_test_decisions=["listen"] * 12)
    await client.send_all(append_events(native.speech_pcm(2), chunk_ms=200))
    await client.send({"type": "input_audio_buffer.commit"})
    await native.decisions(client, 2)
    refusals = [({"instructions": "Be brief.", "temperature": 0.6}, "instructions, temperature"),
                ({"audio": {"output": {"voice": "alloy"}}}, "audio.output.voice"),
                ({"max_output_tokens": 20, "tools": []}, "max_output_tokens, tools")]
    for index, (overrides, named) in enumerate(refusals):
        await client.send({"type": "response.create", "event_id": f"over-{index}", "response": overrides})
        error = (await client.next())
        assert error["type"] == "error", error
        assert error["error"]["code"] == "unsupported_native_response_options"
        assert error["error"]["event_id"] == f"over-{index}" and error["error"]["message"].endswith(named)
    await client.send({"type": "response.create", "response": {"metadata": {"topic": "kept"}}})
    events = await client.until("response.done")
    assert not [e for e in events if e["type"] == "error"]
    assert events[0]["type"] == "response.created" and events[-1]["response"]["status"] == "completed"
    await client.close_session()


@pytest.mark.parametrize("extra_body", [{"initial_user_text": "hi"}, {"duplex_stage_max_tokens": 5},
                                        {"ref_audio_data": "AAAA", "duplex_window_config": {}}])
async def test_server_owned_extra_body_keys_refuse_the_open(server, extra_body: dict[str, Any]) -> None:
    """§2.6, §9.2, §9.4: `invalid_duplex_runtime_config` naming the keys; the open fails."""
    url, _ = server
    client = await Client.open(f"{url}/v1/realtime?duplex=1")
    await client.send({"type": "session.update", "session": {"model": MODEL, "modalities": ["text"],
                                                             "extra_body": {"auto_response": True, **extra_body}}})
    error = await client.next()
    assert (error["type"], error["error"]["code"]) == ("error", "invalid_duplex_runtime_config"), error
    assert error["error"]["message"] == f"duplex runtime configuration is server-owned: {', '.join(extra_body)}"
    await client.ws.close()


FRAME_PROBLEMS = [
    ({"video_frames": "not-a-list"}, "video_frames", "video_frames must be a list of base64-encoded images"),
    ({"video_frames": {"0": "frame"}}, "video_frames", "video_frames must be a list of base64-encoded images"),
    ({"video_frames": [7]}, "video_frames", "video_frames must be a list of base64-encoded images"),
    ({"video_frames": ["AAAA"] * 3}, "video_frames", "video_frames carries more than 2 frames for one append"),
    ({"video_frames": [""]}, "video_frames", "video_frames must be non-empty base64 strings"),
    ({"max_slice_nums": 2}, "max_slice_nums", "max_slice_nums is not selectable on the wire"),
]


async def test_video_frame_shape_errors_are_invalid_video_frames(server) -> None:
    """§6.3, §9.2, §9.3: every violation is `invalid_video_frames`, `param` naming the field and
    the `event_id` echoed; the append is dropped and the session goes on."""
    url, _ = server
    client = await native.open_session(url, duplex_test_decisions=["listen"] * 3)
    for index, (fields, param, message) in enumerate(FRAME_PROBLEMS):
        await client.send({**append_events(native.silence_pcm(200))[0], "event_id": f"frames-{index}", **fields})
        error = await client.next()
        assert (error["type"], error["error"]["code"], error["error"]["param"]) == (
            "error", "invalid_video_frames", param), error
        assert error["error"]["event_id"] == f"frames-{index}" and error["error"]["message"].startswith(message)
    await client.send_all(append_events(native.silence_pcm(native.unit_boundary_ms(0)), chunk_ms=200,
                                        frames=[[native.frame_b64(0)]]))
    assert unit_record(await native.decisions(client, 1)) == [("response.listen", "model_listen")]
    await client.close_session()


def test_a_unit_takes_the_frames_and_force_of_the_appends_that_fill_it() -> None:
    """§6.3 binding with appends cut anyhow: a unit's call carries the frame groups of the appends in
    it, in order (the model binds the first to this unit and queues the rest), and the force of the
    append that closes it; the samples past the unit's end wait for the next unit."""
    units = UnitAssembler()
    units.add(Piece(np.ones(300, np.float32), frames=[b"a"]))
    units.add(Piece(np.zeros(300, np.float32), frames=[b"b"], force_listen=True))
    assert units.take(1000) is None
    units.add(Piece(np.full(700, 2, np.float32), frames=[b"c"]))
    unit = units.take(1000)
    assert unit is not None and unit.samples.size == 1000 and unit.samples[-1] == 2
    assert unit.frame_groups == [[b"a"], [b"b"], [b"c"]] and unit.force_listen is False
    assert units.samples == 300
    units.pad(1000, force_listen=True)  # a commit: silence to the unit's end
    rest = units.take(1000)
    assert rest is not None and rest.frame_groups == [] and rest.force_listen  # the rest has no frames of its own
    assert (rest.samples[:300] == 2).all() and not rest.samples[300:].any()
