"""Client events of the protocol (docs/conformance.md §3) on the duplex lane's wire, one
connection: conversation items, clear, a manual turn, then what can be done with the finished
answer (retrieve, truncate, ack, clear, cancel), and a close with a reason."""

from __future__ import annotations

import asyncio

import pytest

from tests.realtime_helpers import MODEL_NAME, Client, append_events, fixture_pcm, running_server


@pytest.fixture(scope="module")
def duplex_server(turn_model):
    with running_server(turn_model, {"stages.1.default_sampling_params.max_tokens": 32},
                        session_mode="duplex") as (url, _, _):
        yield url


async def reply(client: Client, event: dict, kinds: list[str]) -> list[dict]:
    """Send `event`; the next events must be exactly of `kinds`, with no `error` and no echo of
    the client's `event_id` on these success events."""
    await client.send(event)
    got = [await client.next(timeout=60) for _ in kinds]
    assert [e["type"] for e in got] == kinds, got
    assert all(e.get("event_id") != event.get("event_id") for e in got)
    return got


async def test_client_events_on_the_duplex_lane(duplex_server) -> None:
    client = await Client.open(f"{duplex_server}/v1/realtime?model={MODEL_NAME}")
    await client.until("session.updated")
    text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello."}]}
    added, created, done = await reply(client, {"type": "conversation.item.create", "event_id": "c1", "item": text},
                                       ["conversation.item.added", "conversation.item.created",
                                        "conversation.item.done"])  # §3.5
    item_id = added["item"]["id"]
    assert item_id.startswith("item_") and created["item"]["id"] == done["item"]["id"] == item_id
    retrieved, = await reply(client, {"type": "conversation.item.retrieve", "event_id": "c2", "item_id": item_id},
                             ["conversation.item.retrieved"])  # §3.8
    assert retrieved["item"]["content"][0]["text"] == "Hello."
    deleted, = await reply(client, {"type": "conversation.item.delete", "event_id": "c3", "item_id": item_id},
                           ["conversation.item.deleted"])  # §3.6
    assert deleted["item_id"] == item_id
    await reply(client, {"type": "input_audio_buffer.clear", "event_id": "c4"}, ["input_audio_buffer.cleared"])  # §3.4

    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input.commit"})  # §3.3: the alias answers by default
    await client.send({"type": "input_audio_buffer.clear"})  # §3.4: the answer goes on
    turn = await client.until("response.done", timeout=120)
    assert "error" not in [e["type"] for e in turn] and "input_audio_buffer.cleared" in [e["type"] for e in turn]
    assert turn[-1]["response"]["status"] == "completed"
    assert (await client.next())["type"] == "rate_limits.updated"
    response_id = turn[-1]["response"]["id"]
    answer_id = f"item_{response_id}"
    assert turn[-1]["response"]["output"][0]["id"] == answer_id

    truncated, acked = await reply(client, {"type": "conversation.item.truncate", "item_id": answer_id,
                                            "content_index": 0, "audio_end_ms": 0},
                                   ["conversation.item.truncated", "playback.acknowledged"])  # §3.7
    assert truncated["item_id"] == answer_id and acked["event"]["truncate"] is True
    after, = await reply(client, {"type": "conversation.item.retrieve", "item_id": answer_id},
                         ["conversation.item.retrieved"])
    assert after["item"]["content"][0]["transcript"] == ""  # cut to what was heard: nothing
    acked, = await reply(client, {"type": "playback.ack", "item_id": answer_id, "played_ms": 10},
                         ["playback.acknowledged"])  # §3.12: the response id comes from item_id
    assert (acked["event"]["item_id"], acked["event"]["played_ms"]) == (answer_id, 10)
    cleared, = await reply(client, {"type": "output_audio_buffer.clear", "response_id": response_id},
                           ["output_audio_buffer.cleared"])  # §3.11: finished, so only the reply
    assert cleared["response_id"] == response_id
    await client.send({"type": "response.cancel", "response_id": response_id, "event_id": "late"})
    error = (await client.next(timeout=30))["error"]  # §3.10
    assert (error["code"], error["event_id"]) == ("response_not_active", "late")

    closed, = await reply(client, {"type": "session.close", "reason": "done here"}, ["session.closed"])  # §3.13
    assert closed["reason"] == "done here"
    await asyncio.wait_for(client.ws.wait_closed(), 10)
    assert (client.ws.close_code, client.ws.close_reason) == (1000, "done here")
    await client.close()


async def test_clear_drops_an_open_speech_segment_and_resets_vad(duplex_server) -> None:
    """§3.4: a clear during speech answers `input_audio_buffer.cleared`, ends the segment
    without `speech_stopped`, and resets the detector: the silence after it stops nothing."""
    client = await Client.open(f"{duplex_server}/v1/realtime?model={MODEL_NAME}")
    await client.until("session.updated")
    await client.send({"type": "session.update", "session": {"turn_detection": {"type": "server_vad"}}})
    await client.until("session.updated")
    speech = append_events(fixture_pcm("speech_en_single.wav"))
    await client.send_all(speech[:15])  # 1.5 s: speech has started, not stopped
    await client.until("input_audio_buffer.speech_started", timeout=60)
    await client.send({"type": "input_audio_buffer.clear"})
    await client.send_all(append_events(b"\0\0" * 16000 * 2))
    await client.send({"type": "session.heartbeat"})
    after = await client.until("session.heartbeat_ack", timeout=60)
    kinds = [e["type"] for e in after]
    assert "input_audio_buffer.cleared" in kinds and "error" not in kinds
    assert "input_audio_buffer.speech_stopped" not in kinds and "input_audio_buffer.committed" not in kinds
    await client.close()


async def test_idle_timeout_ms_commits_an_empty_turn_after_the_answer(duplex_server) -> None:
    """§2.4.1: with server VAD and `idle_timeout_ms`, no speech after an answer's audio →
    `input_audio_buffer.timeout_triggered`, the empty turn committed and answered."""
    client = await Client.open(f"{duplex_server}/v1/realtime?model={MODEL_NAME}")
    await client.until("session.updated")
    await client.send({"type": "session.update", "session": {
        "turn_detection": {"type": "server_vad", "idle_timeout_ms": 500}}})
    await client.until("session.updated")
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=1.5)))
    first = await client.until("response.done", timeout=120)
    assert "error" not in [e["type"] for e in first]
    events = await client.until("input_audio_buffer.timeout_triggered", timeout=60)
    triggered = events[-1]
    assert {"audio_start_ms", "audio_end_ms", "item_id"} <= triggered.keys()
    answer = await client.until("response.done", timeout=120)
    committed = [e for e in answer if e["type"] == "input_audio_buffer.committed"]
    assert [e["item_id"] for e in committed] == [triggered["item_id"]]
    assert "error" not in [e["type"] for e in events + answer]
    await client.close()


def listens_for_silence(events: list[dict]) -> list[dict]:
    """The `response.listen` events among `events`, each checked to say `silence_or_noise` (§4.12)."""
    listens = [e for e in events if e["type"] == "response.listen"]
    assert all(e["response"]["metadata"]["reason"] == "silence_or_noise" and "response_id" not in e
               for e in listens), listens
    return listens


async def test_a_commit_of_silence_is_an_empty_turn_without_an_answer(duplex_server) -> None:
    """§3.2 step 6 and §3.3 (D): silence while idle is not buffered and gets `response.listen`
    (`silence_or_noise`) per append; committing it gives the empty user turn, no error, no
    response, even with create_response; so does `is_speech:false` with nothing pending."""
    client = await Client.open(f"{duplex_server}/v1/realtime?model={MODEL_NAME}")
    await client.until("session.updated")
    await client.send_all(append_events(b"\0\0" * 3200))  # two 100 ms appends of silence
    assert len(listens_for_silence([await client.next(timeout=30) for _ in range(2)])) == 2
    for commit in ({"type": "input_audio_buffer.commit", "create_response": True, "event_id": "s1"},
                   {"type": "input.commit", "is_speech": False, "event_id": "s2"}):
        await client.send(commit)
        await client.send({"type": "session.heartbeat"})
        events = await client.until("session.heartbeat_ack", timeout=60)
        kinds = [e["type"] for e in events]
        assert kinds == ["conversation.item.added", "conversation.item.created", "input_audio_buffer.committed",
                         "conversation.item.done", "response.listen", "session.heartbeat_ack"], events
        committed = events[2]
        assert (committed["event"]["empty"], committed["event"]["is_speech"], committed["event"]["no_response"]) == (
            True, False, True)
        item = events[3]["item"]
        assert item["id"] == events[0]["item"]["id"] == committed["item_id"] and item["role"] == "user"
        assert item["content"] == [{"type": "input_audio", "transcript": "", "is_speech": False}]
        assert len(listens_for_silence(events)) == 1
    await client.send({"type": "response.create", "event_id": "r1"})  # nothing new to answer
    error = (await client.next(timeout=30))["error"]
    assert (error["code"], error["event_id"]) == ("response_create_without_input", "r1")
    await client.close()


async def test_speech_between_silences_is_buffered_alone_and_answered(duplex_server) -> None:
    """§3.2 step 6 (D): around speech, idle silence is still left out (one `response.listen`
    each); the speech is the turn, framed by its heuristic segment (§5.1) on the client's clock,
    and it is answered."""
    speech = fixture_pcm("speech_en_single.wav")[500 * 32:2400 * 32]  # 1.9 s, every 100 ms of it voiced
    silence = b"\0\0" * 4800  # 300 ms
    client = await Client.open(f"{duplex_server}/v1/realtime?model={MODEL_NAME}")
    await client.until("session.updated")
    await client.send_all(append_events(silence + speech + silence))
    await client.send({"type": "input_audio_buffer.commit", "create_response": True})
    events = await client.until("response.done", timeout=120)
    kinds = [e["type"] for e in events]
    assert "error" not in kinds and events[-1]["response"]["status"] == "completed"
    assert len(listens_for_silence(events)) == 6
    assert kinds.index("input_audio_buffer.speech_started") == 3  # after the leading silence's listens
    started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    assert (started["audio_start_ms"], stopped["audio_end_ms"]) == (300, 2500)
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    assert "empty" not in committed["event"]
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    await client.close()
