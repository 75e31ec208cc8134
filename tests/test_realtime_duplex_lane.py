"""The duplex lane against a real server on the tiny duplex deploy (docs/realtime-api.md §13):
autostart, a manual-commit turn answered with speech, playback acks, close; images in the
conversation; a handshake that fails; resume after a dropped socket, and every way a resume
fails."""

from __future__ import annotations

import asyncio
import base64
import io

import pytest
import websockets
from PIL import Image

from tests.realtime_helpers import MODEL_NAME, Client, append_events, fixture_pcm, running_server
from vllm_omni.client.events import image_message

GRACE_S = 3.0


@pytest.fixture(scope="module")
def server(tiny_loaded):
    overrides = {"stages.1.default_sampling_params.max_tokens": 48}
    with running_server(tiny_loaded, overrides, session_mode="duplex", disconnect_grace_s=GRACE_S) as (url, engine, _):
        yield url, engine


async def until(client: Client, kind: str) -> list[dict]:
    return await client.until(kind, timeout=120)


async def history_of(client: Client, response_id: str) -> str:
    """The assistant item's transcript as the conversation history holds it."""
    await client.send({"type": "conversation.item.retrieve", "item_id": f"item_{response_id}"})
    return (await until(client, "conversation.item.retrieved"))[-1]["item"]["content"][0]["transcript"]


async def test_a_duplex_session_opens_by_autostart_answers_a_turn_and_closes(server) -> None:
    url, engine = server
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
    created, updated = await client.next(), await client.next()
    assert (created["type"], updated["type"]) == ("session.created", "session.updated")
    assert created["session"]["id"].startswith("duplex-")
    assert created["session"]["capabilities"]["chunk_period_ms"] == 1000
    await client.send({"type": "session.update", "session": {
        "modalities": ["audio", "text"], "input_audio_format": "pcm16", "turn_detection": None,
        "overlap_policy": "listen_only", "playback_commit_policy": "ack_only", "extra_body": {}}})
    assert (await client.next())["type"] == "session.updated"
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    turn = await until(client, "response.done")
    done = turn[-1]["response"]
    assert done["status"] == "completed" and "error" not in [e["type"] for e in turn]
    audio_ms = max(e["vllm_omni"]["audio_duration_ms"] for e in turn if e["type"] == "response.output_audio.delta")
    spoken = done["output"][0]["content"][0]["transcript"]
    assert spoken and await history_of(client, done["id"]) == ""  # ack_only: nothing heard yet
    await client.send({"type": "playback.ack", "response_id": done["id"], "item_id": f"item_{done['id']}",
                       "played_ms": audio_ms})
    acked = (await until(client, "playback.acknowledged"))[-1]["event"]
    assert (acked["item_id"], acked["played_ms"], acked["history_committed"]) == (f"item_{done['id']}", audio_ms, True)
    assert await history_of(client, done["id"]) == spoken
    await client.send({"type": "session.close"})
    closed = (await until(client, "session.closed"))[-1]
    assert closed["session_id"] == created["session"]["id"]
    await asyncio.wait_for(client.ws.wait_closed(), 10)
    assert client.ws.close_code == 1000
    await client.close()


def png_data_url(color: tuple[int, int, int]) -> str:
    """A 96x64 picture: 6 image positions in the thinker's prompt (a 4x6 patch grid merged 2x2)."""
    out = io.BytesIO()
    Image.new("RGB", (96, 64), color).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


async def test_the_thinker_sees_the_images_of_the_conversation(server) -> None:
    """An image item, then a spoken question about it: the prompt of each answer holds the
    picture (usage counts its positions), on later turns too; a bad image is refused and the
    session goes on."""
    url, _ = server
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
    created = await client.next()
    assert created["session"]["capabilities"]["supports_image_input"] is True
    await client.send({"type": "session.update", "session": {"turn_detection": None, "modalities": ["text"]}})
    await client.send(image_message("data:image/gif;base64,R0lGODlh"))
    assert (await until(client, "error"))[-1]["error"]["code"] == "invalid_image"
    await client.send(image_message(png_data_url((250, 200, 0))))
    image_item = (await until(client, "conversation.item.done"))[-1]["item"]
    assert image_item["content"][0]["type"] == "input_image"
    image_tokens = []
    for _ in range(2):
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
        await client.send({"type": "input_audio_buffer.commit"})
        await client.send({"type": "response.create"})
        done = (await until(client, "response.done"))[-1]["response"]
        assert done["status"] == "completed", done
        image_tokens.append(done["usage"]["input_token_details"]["image_tokens"])
    assert image_tokens == [6, 6]
    await client.close()


async def test_a_failed_handshake_is_one_error_then_close_1008(server) -> None:
    url, _ = server
    client = await Client.open(f"{url}/v1/duplex?autostart=0", extensions=False)
    await client.send("{not json")
    error = await client.next()
    assert error["type"] == "error" and error["error"]["code"] == "invalid_json"
    with pytest.raises(websockets.exceptions.ConnectionClosed):
        await client.next(timeout=10)
    assert client.ws.close_code == 1008 and client.ws.close_reason == "invalid_json"
    await client.close()


async def test_a_session_without_activity_loses_its_lease(tiny_loaded) -> None:
    """Heartbeats keep a session; event acks alone do not: after idle_ttl_s it expires, its
    socket closes 1000 with the reason, and its slot (the only one: a second session was
    refused meanwhile) is free."""
    leased = running_server(tiny_loaded, {}, session_mode="duplex", idle_ttl_s=1.5, reaper_interval_s=0.1,
                            max_sessions=1)
    with leased as (url, _, _):
        client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
        await client.until("session.updated", timeout=30)
        full = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
        assert (await full.next())["error"]["code"] == "resource_exhausted"  # max_sessions 1
        await asyncio.wait_for(full.ws.wait_closed(), 10)
        assert (full.ws.close_code, full.ws.close_reason) == (1013, "resource_exhausted")
        await full.close()
        await client.send({"type": "session.resume", "session_id": "x", "resume_token": "y"})
        late_resume = (await client.until("error", timeout=10))[-1]
        assert late_resume["error"]["code"] == "unsupported_session_resume"  # only as a first message
        for _ in range(6):  # 3 s of heartbeats: twice the TTL
            await client.send({"type": "session.heartbeat"})
            await client.until("session.heartbeat_ack", timeout=10)
            await asyncio.sleep(0.5)
        await client.send({"type": "session.event_ack", "server_event_seq": 1})
        expired = (await client.until("session.expired", timeout=10))[-1]
        assert expired["reason"] == "idle_ttl_expired"
        await asyncio.wait_for(client.ws.wait_closed(), 10)
        assert (client.ws.close_code, client.ws.close_reason) == (1000, "idle_ttl_expired")
        await client.close()
        again = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
        assert (await again.next())["type"] == "session.created"  # the one slot is free
        await again.close()


# Resume (docs/realtime-api.md §13.4) ------------------------------------------------------------

async def start_turn(url: str) -> tuple[Client, dict]:
    """An autostarted session asked to answer speech; returns the client and session.created."""
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
    created = await client.next()
    assert created["type"] == "session.created" and "server_event_seq" not in created
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    return client, created


def audio_of(events: list[dict]) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")


async def resume(url: str, session_id: str, token: str, last_seq: int) -> Client:
    client = await Client.open(f"{url}/v1/realtime?resume=1", extensions=False)
    await client.send({"type": "session.resume", "session_id": session_id, "resume_token": token,
                       "last_received_server_event_seq": last_seq})
    return client


async def test_a_dropped_socket_resumes_with_every_missed_event_once(server) -> None:
    url, _ = server
    reference, _ = await start_turn(url)
    expected_audio = audio_of(await until(reference, "response.done"))
    await reference.close()

    client, created = await start_turn(url)
    before = await until(client, "response.output_audio.delta")
    client.ws.transport.abort()  # no close frame: the network went away mid-answer
    await client.close()
    last_seq = before[-1]["server_event_seq"]
    again = await resume(url, created["session"]["id"], created["resume_token"], last_seq)
    resumed = await again.next()
    assert resumed["type"] == "session.resumed" and resumed["attachment_generation"] == 2
    assert resumed["resume_token"] != created["resume_token"] and "server_event_seq" not in resumed
    after = await until(again, "response.done")
    seqs = [e["server_event_seq"] for e in before + after]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # every event once, none missing
    assert audio_of(before) + audio_of(after) == expected_audio and expected_audio
    await again.send({"type": "session.event_ack", "server_event_seq": seqs[-1] + 100})
    ack_error = (await until(again, "error"))[-1]
    assert ack_error["error"]["code"] == "invalid_event_ack" and "server_event_seq" not in ack_error
    for bad, code in (({"type": "no.such.event"}, "unknown_event"),
                      ({"type": "input_audio_buffer.append", "audio": 7}, "bad_event")):
        await again.send(bad)
        transport_error = (await until(again, "error"))[-1]  # events that fail validation are not journaled
        assert transport_error["error"]["code"] == code and "server_event_seq" not in transport_error
    await again.close()

    stale = await resume(url, created["session"]["id"], created["resume_token"], 0)  # the rotated token
    assert (await stale.next())["error"]["code"] == "invalid_resume_token"
    with pytest.raises(websockets.exceptions.ConnectionClosed):
        await stale.next(timeout=10)
    assert (stale.ws.close_code, stale.ws.close_reason) == (1008, "invalid_resume_token")
    await stale.close()


async def test_a_second_socket_replaces_the_first(server) -> None:
    url, _ = server
    first, created = await start_turn(url)
    second = await resume(url, created["session"]["id"], created["resume_token"], 0)
    assert (await second.next())["type"] == "session.resumed"
    replaced = (await until(first, "session.replaced"))[-1]
    assert (replaced["session_id"], replaced["attachment_generation"]) == (created["session"]["id"], 1)
    await asyncio.wait_for(first.ws.wait_closed(), 10)
    assert (first.ws.close_code, first.ws.close_reason) == (1000, "session_replaced")
    replayed = await until(second, "response.done")  # from the first event on: nothing was acked
    assert replayed[0]["server_event_seq"] == 1 and replayed[-1]["response"]["status"] == "completed"
    await second.send({"type": "session.close"})
    await until(second, "session.closed")
    await second.close()
    await first.close()


@pytest.mark.parametrize(("session_id", "token", "seq", "code"), [
    ("duplex-unknown", "token", 0, "session_resume_expired"),
    (None, "wrong-token", 0, "invalid_resume_token"),
    (None, None, 10_000, "session_resume_conflict"),
])
async def test_every_resume_failure_has_its_error(server, session_id, token, seq, code) -> None:
    url, _ = server
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
    created = await client.next()
    failing = await resume(url, session_id or created["session"]["id"], token or created["resume_token"], seq)
    assert (await failing.next())["error"]["code"] == code
    with pytest.raises(websockets.exceptions.ConnectionClosed):
        await failing.next(timeout=10)
    assert failing.ws.close_code == 1008
    await failing.close()
    await client.close()


async def test_a_detached_session_ends_after_its_grace(server) -> None:
    url, engine = server
    client, created = await start_turn(url)
    await until(client, "response.done")
    await client.close()
    await asyncio.sleep(GRACE_S + 1.5)
    late = await resume(url, created["session"]["id"], created["resume_token"], 0)
    assert (await late.next())["error"]["code"] == "session_resume_expired"
    await late.close()
    assert engine.num_active_requests() == 0


# Overlap (docs/realtime-api.md §13.6) ------------------------------------------------------------

async def vad_session(url: str, policy: str) -> Client:
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}", extensions=False)
    await until(client, "session.updated")
    await client.send({"type": "session.update", "session": {
        "turn_detection": {"type": "server_vad"}, "overlap_policy": policy}})
    await until(client, "session.updated")
    return client


async def speak_over_the_answer(client: Client) -> tuple[list[dict], dict]:
    """A question (server VAD ends it); once its answer's first audio arrives, acknowledge
    200 ms of playback and ask another; returns the events up to the first answer's done."""
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=0.6)))
    first = await until(client, "response.output_audio.delta")
    response_id = first[-1]["response_id"]
    await client.send({"type": "playback.ack", "response_id": response_id, "played_ms": 200})
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=0.6)))
    return first + await until(client, "response.done"), {"id": response_id}


async def test_speech_over_an_answer_barges_in_and_is_answered(server) -> None:
    url, _ = server
    client = await vad_session(url, "barge_in_on_speech")
    events, first = await speak_over_the_answer(client)
    kinds = [e["type"] for e in events]
    decision = next(e for e in events if e["type"] == "overlap.decision")
    assert (decision["action"], decision["reason"]) == ("barge_in", "server_vad_speech_started")
    done = events[-1]["response"]
    assert (done["id"], done["status"], done["status_details"]["reason"]) == (first["id"], "cancelled",
                                                                             "turn_detected")
    after_onset = kinds[kinds.index("input_audio_buffer.speech_started", kinds.index("response.created")):]
    assert after_onset.count("response.output_audio.delta") <= 1  # stopped within one chunk
    kept = done["output"][0]["content"][0]["transcript"]
    spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert len(kept) <= len(spoken)  # cut at the acknowledged 200 ms
    second = (await until(client, "response.done"))[-1]["response"]
    assert second["id"] != first["id"] and second["status"] == "completed"
    await client.close()


async def test_speech_over_an_answer_waits_for_it_under_listen_only(server) -> None:
    url, _ = server
    client = await vad_session(url, "listen_only")
    events, first = await speak_over_the_answer(client)
    assert events[-1]["response"]["status"] == "completed" and "overlap.decision" not in [e["type"] for e in events]
    second = (await until(client, "response.done"))[-1]["response"]
    assert second["id"] != first["id"] and second["status"] == "completed"
    await client.close()


async def test_a_back_channel_over_an_answer_starts_no_turn(server) -> None:
    """400 ms of speech ("mm-hm") while the answer plays: server VAD commits it as an empty,
    unanswered turn, and the answer goes on to complete."""
    url, _ = server
    client = await vad_session(url, "listen_only")
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=0.6)))
    await until(client, "response.output_audio.delta")
    speech = fixture_pcm("speech_en_single.wav")[16000:28800]  # 0.5-0.9 s: a word
    await client.send_all(append_events(speech + b"\0\0" * 16000))
    events = await until(client, "response.done")
    assert events[-1]["response"]["status"] == "completed"
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert committed and committed[-1]["event"]["no_response"] is True and committed[-1]["event"]["overlap_ack"]
    await client.send({"type": "session.heartbeat"})
    later = await until(client, "session.heartbeat_ack")
    await asyncio.sleep(2.0)
    assert "response.created" not in [e["type"] for e in later]
    await client.send({"type": "session.close"})
    assert "response.created" not in [e["type"] for e in await until(client, "session.closed")]
    await client.close()

