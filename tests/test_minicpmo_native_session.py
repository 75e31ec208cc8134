"""MiniCPM-o 4.5 natively duplex on the wire (docs/realtime-api.md §13.7), against a real server
on the tiny checkpoint: the unit grid, listen and speak decisions, turn ends, forced listens,
frames, barge-in with the context kept, silence continuation, playback acks and the
session-config errors."""

from __future__ import annotations

import asyncio
import base64
import io
import wave
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.realtime_helpers import Client, fixture_pcm, serving
from vllm_omni.client.native_duplex import UNIT_EVENTS, clip_units, native_opening, run_native_session
from vllm_omni.client.streaming import append_events, unit_boundary_ms
from vllm_omni.client.timing import summarize
from vllm_omni.config import load_deploy_config
from vllm_omni.models.registry import load_engine
from vllm_omni.session.base import NativeDuplexSettings

MODEL = "minicpmo-tiny"
CONTINUATION_LIMIT = 3


@pytest.fixture(scope="module")
def server(minicpmo_vllm_engine):
    settings = NativeDuplexSettings(allow_test_decisions=True, continuation_limit_units=CONTINUATION_LIMIT,
                                    continuation_period_ms=300)
    with serving(minicpmo_vllm_engine, model_name=MODEL, session_mode="duplex", native_duplex=settings,
                 max_sessions=4, borrowed=True) as (url, engine, _):  # as the deploy: one vLLM sequence per session
        yield url, engine


async def open_session(url: str, turn_detection: dict[str, Any] | None = None, **extra_body: Any) -> Client:
    client = await Client.open(f"{url}/v1/realtime?duplex=1")
    await client.send({"type": "session.update", "session": {
        "model": MODEL, "modalities": ["text"], "turn_detection": turn_detection, "input_audio_format": "pcm16",
        "extra_body": {"auto_response": True, **extra_body}}})
    created = await client.next()
    assert created["type"] == "session.created", created
    assert (await client.next())["type"] == "session.updated"
    return client


def silence_pcm(ms: int) -> bytes:
    return b"\0\0" * (16 * ms)


async def decisions(client: Client, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Events until `count` units were decided (a unit: a listen, or a speaking unit's text delta)."""
    events: list[dict[str, Any]] = []
    decided = 0
    while decided < count:
        event = await client.next(timeout)
        events.append(event)
        assert event["type"] != "error", event
        decided += event["type"] in UNIT_EVENTS
    return events


async def test_unit_cadence_follows_the_audio_grid_not_the_appends(server) -> None:
    url, _ = server
    for chunk_ms in (200, 130):
        client = await open_session(url, duplex_test_decisions=["listen"] * 8)
        pcm = fixture_pcm("speech_en_single.wav")[: 2 * 16 * 4300]
        await client.send_all(append_events(pcm, chunk_ms=chunk_ms))
        expected = (4300 - 1030) // 1000 + 1
        events = await decisions(client, expected)
        listens = [e for e in events if e["type"] == "response.listen"]
        assert len(listens) == expected == 4
        assert all(e["response"]["metadata"]["reason"] == "model_listen" and "response_id" not in e for e in listens)
        await client.close_session()


async def test_a_speaking_turn_opens_one_response_and_ends_it(server) -> None:
    url, _ = server
    client = await open_session(url, duplex_test_decisions=["listen", "speak", "speak", "speak_end", "listen"])
    await client.send_all(append_events(silence_pcm(unit_boundary_ms(4)), chunk_ms=200))
    events = await decisions(client, 5)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.listen" and kinds.count("response.created") == 1
    assert kinds.count("response.speak") == 1 and kinds.index("response.speak") < kinds.index(
        "response.output_text.delta")
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed"
    assert kinds.index("response.done") < len(kinds) - 1 and kinds[-1] == "response.listen"
    assert "response_id" not in events[-1]
    await client.close_session()


async def test_a_commit_pads_the_residual_into_one_more_unit(server) -> None:
    url, _ = server
    for clip_ms, expected in ((4300, 5), (unit_boundary_ms(3), 4)):
        client = await open_session(url, duplex_test_decisions=["listen"] * 8)
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav")[: 32 * clip_ms], chunk_ms=200))
        await client.send({"type": "input_audio_buffer.commit", "final": True})
        events = await decisions(client, expected)
        assert sum(e["type"] == "response.listen" for e in events) == expected
        assert "input_audio_buffer.committed" in [e["type"] for e in events]
        await client.send({"type": "session.heartbeat"})  # nothing more is decided: the next event answers this
        assert (await client.next())["type"] == "session.heartbeat_ack"
        await client.close_session()


async def test_force_listen_count_holds_the_first_units_of_every_turn(server) -> None:
    url, _ = server
    script = ["speak", "speak", "speak_end", "speak", "speak", "speak", "speak", "speak"]
    client = await open_session(url, force_listen_count=2, duplex_test_decisions=script)
    await client.send_all(append_events(silence_pcm(unit_boundary_ms(6)), chunk_ms=200))
    events = await decisions(client, 7)
    units = [e["type"] for e in events if e["type"] in ("response.listen", "response.output_text.delta",
                                                        "response.done")]
    # units 0-1 forced to listen; unit 2 speaks and ends the turn; units 3-4 listen again; 5-6 speak
    assert units[:2] == ["response.listen"] * 2
    assert units[2:4] == ["response.output_text.delta", "response.done"]
    assert units[4:6] == ["response.listen"] * 2
    assert units[6:] == ["response.output_text.delta"] * 2
    await client.close_session()


async def test_force_listen_on_an_append_makes_the_unit_it_closes_listen(server) -> None:
    url, _ = server
    appends = append_events(silence_pcm(unit_boundary_ms(2)), chunk_ms=200)
    closing = next(i for i, e in enumerate(appends) if (i + 1) * 200 >= unit_boundary_ms(1))
    appends[closing]["force_listen"] = True
    client = await open_session(url, duplex_test_decisions=["speak"] * 3)
    await client.send_all(appends)
    events = await decisions(client, 3)
    kinds = [e["type"] for e in events if e["type"] in ("response.listen", "response.output_text.delta",
                                                        "response.done")]
    # unit 0 speaks; unit 1, forced, listens and so closes the model's turn; unit 2 speaks anew
    assert kinds == ["response.output_text.delta", "response.listen", "response.done",
                     "response.output_text.delta"]
    first = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    listen = next(e for e in events if e["type"] == "response.listen")
    assert listen["response_id"] == first and listen["response"]["metadata"]["reason"] == "forced_listen"
    assert sum(e["type"] == "response.created" for e in events) == 2
    await client.close_session()


def frame_b64(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return base64.b64encode(out.getvalue()).decode()


async def test_frames_ride_the_appends_that_close_their_units(server) -> None:
    url, _ = server
    client = await open_session(url, duplex_test_decisions=["listen"] * 3)
    frames = [[frame_b64(k)] for k in range(3)]
    await client.send_all(append_events(silence_pcm(unit_boundary_ms(2)), chunk_ms=200, frames=frames))
    events = await decisions(client, 3)
    assert [e["type"] for e in events] == ["response.listen"] * 3
    problems = [
        ({"audio": "", "video_frames": [frames[0][0]]}, "invalid_input_modality"),
        ({"video_frames": [frames[0][0]] * 3}, "invalid_video_frames"),
        ({"video_frames": ["data:image/jpeg;base64," + frames[0][0]]}, "invalid_video_frames"),
        ({"video_frames": [base64.b64encode(b"GIF89a....").decode()]}, "invalid_video_frames"),
    ]
    for fields, code in problems:
        append = {**append_events(silence_pcm(200))[0], **fields}
        await client.send(append)
        error = await client.next()
        assert (error["type"], error["error"]["code"]) == ("error", code), error
    await client.close_session()


async def test_a_frame_on_an_append_that_closes_no_unit_binds_to_the_next_unit(server) -> None:
    url, _ = server
    client = await open_session(url, duplex_test_decisions=["listen"] * 2)
    appends = append_events(silence_pcm(unit_boundary_ms(1)), chunk_ms=200)
    appends[0]["video_frames"] = [frame_b64(7)]  # 200 ms in: unit 0 closes five appends later
    await client.send_all(appends)
    assert [e["type"] for e in await decisions(client, 2)] == ["response.listen"] * 2
    await client.close_session()


async def test_a_text_seeded_session_may_answer_from_its_first_unit(server) -> None:
    url, _ = server
    client = await open_session(url, duplex_initial_user_text="hi", duplex_test_decisions=["speak", "speak_end"])
    await client.send_all(append_events(silence_pcm(unit_boundary_ms(1)), chunk_ms=200))
    events = await decisions(client, 2)
    kinds = [e["type"] for e in events]
    assert kinds.index("response.created") < kinds.index("response.output_text.delta")
    assert "response.listen" not in kinds and kinds.count("response.output_text.delta") == 2
    await client.close_session()


@pytest.mark.parametrize("interrupt", ["overlap_action", "input.cancel"])
async def test_a_barge_in_cancels_the_response_and_the_next_unit_listens(server, interrupt: str) -> None:
    url, _ = server
    client = await open_session(url, duplex_test_decisions=["speak"] * 8)
    appends = append_events(silence_pcm(unit_boundary_ms(3)), chunk_ms=200)
    boundary = next(i for i in range(len(appends)) if (i + 1) * 200 >= unit_boundary_ms(1))
    await client.send_all(appends[: boundary + 1])
    spoken = await decisions(client, 2)
    response_id = next(e for e in spoken if e["type"] == "response.created")["response"]["id"]
    if interrupt == "overlap_action":
        await client.send({**appends[boundary + 1], "overlap_action": "barge_in"})
    else:  # input.cancel: the client drops its input and stops the answer
        await client.send({"type": "input.cancel"})
        await client.send(appends[boundary + 1])
    cancel = await client.until("response.done")
    if interrupt == "overlap_action":
        decision = next(e for e in cancel if e["type"] == "overlap.decision")
        assert (decision["action"], decision["reason"]) == ("barge_in", "client_overlap_action")
    assert cancel[-1]["response"]["status"] == "cancelled"
    await client.send_all(appends[boundary + 2:])
    after = await decisions(client, 1)  # the model's turn closes in its context: no new response opens
    assert after[-1]["type"] == "response.listen" and "response_id" not in after[-1]
    assert all(e.get("response_id") != response_id for e in after)
    assert "response.created" not in [e["type"] for e in after]
    await client.close_session()


async def test_overlapping_input_keeps_streaming_to_the_model(server) -> None:
    url, _ = server
    client = await open_session(url, duplex_test_decisions=["speak"] * 6)
    appends = append_events(fixture_pcm("speech_en_single.wav")[: 32 * unit_boundary_ms(3)], chunk_ms=200)
    first_unit = unit_boundary_ms(0) // 200 + 1
    await client.send_all(appends[:first_unit])
    events = await decisions(client, 1)
    await client.send_all(appends[first_unit:])  # while the model speaks
    events += await decisions(client, 3)
    overlaps = [e for e in events if e["type"] == "overlap.decision"]
    assert len(overlaps) == len(appends) - first_unit
    assert all((e["action"], e["reason"]) == ("listen", "auto_response_continuous") for e in overlaps)
    assert sum(e["type"] == "response.output_text.delta" for e in events) == 4
    await client.close_session()


async def test_silence_units_continue_a_response_up_to_the_limit(server) -> None:
    url, _ = server
    client = await open_session(url, duplex_test_decisions=["speak"] * 12)
    await client.send_all(append_events(silence_pcm(unit_boundary_ms(0)), chunk_ms=200))
    events = await client.until("response.done", timeout=60)
    units = [e for e in events if e["type"] in ("response.output_text.delta", "response.listen")]
    assert len(units) == 1 + CONTINUATION_LIMIT  # the input's unit, then silence units; the last listens
    assert units[-1]["type"] == "response.listen"
    assert units[-1]["response"]["metadata"]["reason"] == "continuation_limit"
    assert events[-1]["response"]["status"] == "completed"
    await client.close_session()


@pytest.mark.parametrize(("opening", "update", "code"), [
    ({"modalities": ["audio", "text"]}, None, "ref_audio_required"),
    ({}, {"instructions": "Be brief."}, "instructions_update_unsupported"),
    ({}, {"extra_body": {"sliding_window_mode": "basic"}}, "sliding_window_update_unsupported"),
    ({"extra_body": {"duplex_test_decisions": ["shout"]}}, None, "invalid_session_config"),
    ({"extra_body": {"force_listen_count": -1}}, None, "invalid_session_config"),
    ({"extra_body": {"auto_response": "yes"}}, None, "invalid_session_config"),
    ({"extra_body": {"sliding_window_mode": "rolling"}}, None, "invalid_sliding_window_config"),
    ({"extra_body": {"basic_window_high_tokens": 300, "basic_window_low_tokens": 300}}, None,
     "invalid_sliding_window_config"),
])
async def test_session_config_errors(server, opening, update, code) -> None:
    url, _ = server
    client = await Client.open(f"{url}/v1/realtime?duplex=1")
    await client.send({"type": "session.update", "session": {"model": MODEL, "modalities": ["text"], **opening}})
    first = await client.next()
    if update is None:
        assert (first["type"], first["error"]["code"]) == ("error", code), first
        return
    assert first["type"] == "session.created"
    await client.next()
    await client.send({"type": "session.update", "session": update})
    error = await client.next()
    assert (error["type"], error["error"]["code"]) == ("error", code), error
    await client.close_session()


def speech_pcm(units: int) -> bytes:
    """Speech from its first loud 200 ms on, up to the end of unit `units - 1`."""
    return fixture_pcm("speech_en_long.wav")[32 * 200: 32 * (200 + unit_boundary_ms(units - 1))]


async def test_a_turn_the_model_closes_without_a_word_says_so(server) -> None:
    url, _ = server
    client = await open_session(url, duplex_initial_user_text="hi", duplex_test_decisions=["speak"] * 3)
    appends = append_events(silence_pcm(unit_boundary_ms(1)), chunk_ms=200)
    await client.send_all([{**event, "force_listen": True} for event in appends])  # the open turn closes unanswered
    events = await decisions(client, 2)
    assert [e["response"]["metadata"]["reason"] for e in events if e["type"] == "response.listen"] == [
        "model_turn_completed_without_output", "model_listen"]
    await client.close_session()


async def test_server_vad_keeps_the_model_listening_while_the_user_speaks(server) -> None:
    url, _ = server
    client = await open_session(url, turn_detection={"type": "server_vad"}, duplex_test_decisions=["speak"] * 12)
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=2.0), chunk_ms=200))
    events = await client.until("response.speak")
    kinds = [e["type"] for e in events]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index("input_audio_buffer.speech_stopped") < \
        kinds.index("response.speak")
    assert kinds.count("response.listen") >= 3  # the units heard during the speech (3.2 s of it)
    assert "input_audio_buffer.committed" in kinds  # VAD ends the user's item; the model chose when to answer
    await client.close_session()


async def test_a_commit_driven_session_hears_each_turn_at_commit_and_answers_when_asked(server) -> None:
    url, _ = server
    client = await open_session(url, auto_response=False,
                                duplex_test_decisions=["speak", "speak", "speak", "listen", "speak", "speak_end"])
    await client.send_all(append_events(silence_pcm(400), chunk_ms=200))  # idle silence: not kept
    await client.send_all(append_events(speech_pcm(3), chunk_ms=200))
    await client.send({"type": "session.heartbeat"})
    events = [await client.next() for _ in range(4)]
    assert [(e["type"], e.get("response", {}).get("metadata", {}).get("reason")) for e in events] == [
        ("response.listen", "silence_or_noise")] * 2 + [("input_audio_buffer.speech_started", None),
                                                        ("session.heartbeat_ack", None)]  # the speech waits
    await client.send({"type": "input_audio_buffer.commit"})
    heard = await decisions(client, 3)  # the turn's 3 units listen, whatever the model would say
    assert [e["type"] for e in heard].count("response.listen") == 3 and "response.created" not in [
        e["type"] for e in heard]
    await client.send({"type": "response.create"})
    answer = await decisions(client, 3)
    if "response.done" not in [e["type"] for e in answer]:
        answer += await client.until("response.done")
    kinds = [e["type"] for e in answer]
    created = next(e for e in answer if e["type"] == "response.created")["response"]["id"]
    waiting = next(e for e in answer if e["type"] == "response.listen")
    assert waiting["response_id"] == created and waiting["response"]["metadata"]["reason"] == "model_listen"
    assert kinds.index("response.created") < kinds.index("response.listen") < kinds.index("response.speak")
    done = answer[-1]
    assert (done["type"], done["response"]["id"], done["response"]["status"]) == ("response.done", created,
                                                                                "completed")
    await client.close_session()


async def test_a_commit_driven_answer_the_model_never_begins_ends_at_the_limit(server) -> None:
    url, _ = server
    client = await open_session(url, auto_response=False, duplex_test_decisions=["listen"] * 12)
    await client.send_all(append_events(speech_pcm(2), chunk_ms=200))
    await client.send({"type": "input_audio_buffer.commit", "create_response": True})
    events = await decisions(client, 2 + CONTINUATION_LIMIT)
    listens = [e for e in events if e["type"] == "response.listen"]
    assert [e["response"]["metadata"]["reason"] for e in listens] == ["model_listen"] * (1 + CONTINUATION_LIMIT) + [
        "continuation_limit"]
    assert all("response_id" in e for e in listens[2:])  # the silence units fed for the answer
    events += await client.until("response.done")
    assert events[-1]["response"]["status"] == "completed"
    assert not {"response.speak", "response.output_text.delta"} & {e["type"] for e in events}  # nothing was said
    await client.close_session()


async def test_a_commit_driven_session_with_server_vad_answers_the_turn_it_detects(server) -> None:
    url, _ = server
    client = await open_session(url, turn_detection={"type": "server_vad"}, auto_response=False,
                                duplex_test_decisions=["speak_end"] * 12)  # heard units are forced to listen
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=1.0), chunk_ms=200))
    events = await client.until("response.done")
    kinds = [e["type"] for e in events]
    assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed") < \
        kinds.index("response.created") < kinds.index("response.speak")
    assert events[-1]["response"]["status"] == "completed" and kinds.count("response.created") == 1
    await client.close_session()


async def test_a_long_session_stays_inside_its_window(server, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 units with a small basic window: every unit decided, the context never past the high
    mark (white-box: the model's session after each append)."""
    url, engine = server
    thinker = engine.model.thinker
    contexts: list[tuple[int, int]] = []
    append_audio = thinker.append_audio

    async def recorded(session, *args, **kwargs):
        units = await append_audio(session, *args, **kwargs)
        contexts.append((session.positions, session.window.slides))
        return units

    monkeypatch.setattr(thinker, "append_audio", recorded)
    script = (["listen", "speak", "speak_end"] * 14)[:40]
    client = await open_session(url, duplex_test_decisions=script, sliding_window_mode="basic",
                                basic_window_high_tokens=200, basic_window_low_tokens=120)
    await client.send_all(append_events(silence_pcm(unit_boundary_ms(39)), chunk_ms=1000))
    events = await decisions(client, 40)
    done = [e["response"]["status"] for e in events if e["type"] == "response.done"]
    assert done == ["completed"] * 13
    assert max(positions for positions, _ in contexts) <= 200 and contexts[-1][1] >= 3
    await client.close_session()


async def test_the_client_times_every_unit_and_sessions_repeat_exactly(server) -> None:
    url, _ = server
    pcm = fixture_pcm("speech_en_single.wav")  # 5082 ms: units 0-4, and the residual on commit
    script = ["listen", "speak", "speak", "speak_end", "listen", "listen"]
    opening = native_opening(model=MODEL, duplex_test_decisions=script)
    runs = [await run_native_session(f"{url}/v1/realtime", pcm, opening=opening, realtime=False) for _ in range(2)]
    first, second = runs
    assert first.errors == [] and clip_units(pcm) == 6
    assert first.decisions == ["listen", "speak", "speak", "speak", "listen", "listen"]
    assert len(first.decision_lag_ms) == 6 and len(first.responses) == 1
    assert first.responses[0].status == "completed"
    assert [r.transcript for r in first.responses] == [r.transcript for r in second.responses]
    assert first.responses[0].transcript


def voice_url() -> str:
    """Two seconds of real speech as the voice prompt (a WAV data URL)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1), wav.setsampwidth(2), wav.setframerate(16000)
        wav.writeframes(fixture_pcm("speech_en_long.wav")[: 2 * 32000])
    return "data:audio/wav;base64," + base64.b64encode(out.getvalue()).decode()


async def speak_turn(url: str) -> tuple[Client, list[dict[str, Any]]]:
    """A session in the prompt's voice that listens for a unit, speaks three, ends its turn."""
    opening = native_opening(model=MODEL, ref_audio=voice_url(),
                             duplex_test_decisions=["listen", "speak", "speak", "speak_end", "listen"])
    client = await Client.open(f"{url}/v1/realtime?duplex=1")
    await client.send(opening)
    assert [(await client.next())["type"] for _ in range(2)] == ["session.created", "session.updated"]
    await client.send_all(append_events(silence_pcm(unit_boundary_ms(4)), chunk_ms=200))
    return client, await decisions(client, 5)


async def test_speaking_units_stream_audio_then_their_text(server) -> None:
    url, _ = server
    client, events = await speak_turn(url)
    kinds = [e["type"] for e in events]
    deltas = [i for i, kind in enumerate(kinds) if kind == "response.output_audio.delta"]
    assert len(deltas) == 3 and all(kinds[i + 1] == "response.output_audio_transcript.delta" for i in deltas)
    assert kinds.index("response.speak") < deltas[0]
    reports = [events[i]["vllm_omni"] for i in deltas]
    assert all(r["sample_rate_hz"] == 24000 for r in reports)
    durations = [r["audio_duration_ms"] for r in reports]
    assert durations[0] == 1000 and durations[1] == 2000 and durations[2] > 2000  # 25 codes: 1 s of speech
    assert [r["end_of_turn"] for r in reports] == [False, False, True]
    marks = [r["audio_text_marks"][0] for r in reports]
    transcript = "".join(events[i + 1]["delta"] for i in deltas)
    assert [m["audio_end_ms"] for m in marks] == durations and marks[-1]["text_chars"] == len(transcript)
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed" and kinds[-1] == "response.listen"
    await client.close_session()


async def test_playback_acks_commit_the_text_heard_so_far(server) -> None:
    url, _ = server
    client, events = await speak_turn(url)
    done = next(e for e in events if e["type"] == "response.done")["response"]
    marks = [e["vllm_omni"]["audio_text_marks"][0] for e in events if e["type"] == "response.output_audio.delta"]
    transcript = done["output"][0]["content"][0]["transcript"]
    total_ms = marks[-1]["audio_end_ms"]
    for committed_ms, heard in ((1500, (marks[0]["text_chars"] + marks[1]["text_chars"]) // 2),
                                (total_ms, len(transcript))):
        await client.send({"type": "playback.ack", "response_id": done["id"], "played_ms": committed_ms,
                           "committed_ms": committed_ms})
        acked = (await client.until("playback.acknowledged"))[-1]
        assert acked["event"]["history_committed"] is True
        await client.send({"type": "conversation.item.retrieve", "item_id": f"item_{done['id']}"})
        item = (await client.until("conversation.item.retrieved"))[-1]["item"]
        assert item["content"][0]["transcript"] == transcript[:heard]
    await client.close_session()


async def test_a_session_repeats_exactly_audio_included(server) -> None:
    url, _ = server
    runs = []
    for _ in range(2):
        client, events = await speak_turn(url)
        runs.append([(e["type"], e.get("delta")) for e in events if e["type"].startswith("response.output_audio")])
        await client.close_session()
    assert runs[0] == runs[1] and any(kind == "response.output_audio.delta" for kind, _ in runs[0])


async def test_four_sessions_at_real_time_pace_decide_every_unit_in_time(server) -> None:
    """The acceptance load (docs/minicpmo.md, "Serving"): 4 sessions streaming 30 s each in real
    time, in the prompt's voice, listening while the caller talks and speaking turns of two
    units, each session's turns two units after the previous session's (callers are not in
    step; the box has no room for several sessions speaking at once, see the docs); every unit
    decided, within one unit period of its audio, and nothing left behind."""
    url, engine = server
    pcm = (fixture_pcm("speech_en_long.wav") * 3)[: 32 * 30_000]
    pattern = ["listen"] * 6 + ["speak", "speak_end"]
    openings = [native_opening(model=MODEL, ref_audio=voice_url(), duplex_test_decisions=(
        ["listen"] * 2 * session + pattern * 4)[:32]) for session in range(4)]
    results = await asyncio.gather(*(run_native_session(f"{url}/v1/realtime", pcm, opening=opening)
                                     for opening in openings))
    lags = summarize(lag for result in results for lag in result.decision_lag_ms)
    ttfp = summarize(t for result in results for t in result.ttfp_ms)
    print(f"\ndecision lag ms {lags}\nTTFP ms {ttfp}")
    for result in results:
        assert result.errors == []
        assert len(result.decisions) == clip_units(pcm) == 30
        assert result.decisions.count("speak") >= 6 and len(result.responses) >= 3
        assert all(r.status == "completed" and r.audio_ms >= 1000 for r in result.responses)
    assert lags["count"] == 120 and lags["p95"] <= 1000.0  # decided within one unit period of the audio
    for _ in range(100):  # the sessions closed: their model streams are gone
        if engine.open_streams == 0:
            break
        await asyncio.sleep(0.1)
    assert engine.open_streams == 0


def test_a_nice_minicpmo_could_not_apply_is_refused(minicpmo_checkpoint) -> None:
    """Its vLLM thinker runs vLLM's own executor, which does not set a stage's `nice`."""
    deploy = load_deploy_config("configs/minicpmo_4_5_tiny_cpu.yaml")
    stages = [s.model_copy(update={"nice": 5}) if s.backend == "vllm" else s for s in deploy.stages]
    with pytest.raises(ValueError, match="does not take nice"):
        load_engine(minicpmo_checkpoint, deploy.model_copy(update={"stages": stages}))
