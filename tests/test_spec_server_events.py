"""Every field the server events of a recorded turn carry (docs/realtime-api.md §5 and §13,
docs/conformance.md §4), on the GA lane with extensions and on the turn-based duplex lane, against
real servers: the envelope, the input-buffer and item events, each response event, the response
and item objects, and the session-control replies."""

from __future__ import annotations

import asyncio
import base64
import re
from typing import Any

import pytest

from tests.realtime_helpers import MODEL_NAME, Client, append_events, connect, fixture_pcm, running_server

EVENT_ID = re.compile(r"^event_[0-9a-f]{32}$")
ADDRESS = ("response_id", "item_id", "output_index", "content_index")
USAGE = {"total_tokens", "input_tokens", "output_tokens", "input_token_details", "output_token_details"}
PLAYBACK = {"generated_ms", "sent_ms", "played_ms", "committed_ms"}


@pytest.fixture(scope="module")
def servers(turn_model):
    overrides = {"stages.1.default_sampling_params.max_tokens": 40}
    with running_server(turn_model, overrides) as (ga_url, _, _), \
            running_server(turn_model, overrides, session_mode="duplex") as (duplex_url, _, _):
        yield {"G": ga_url, "D": duplex_url}


async def recorded_turn(url: str, lane: str) -> tuple[Client, list[dict[str, Any]]]:
    """A manual turn whose appends carry transcript hints, then a heartbeat; every event so far."""
    client = await opened(url, lane, input_audio_format="pcm16", playback_commit_policy="commit_all_on_done")
    appends = append_events(fixture_pcm("speech_en_single.wav"))
    # on the first spoken appends: the duplex lane does not keep the leading silence's (§3.2 step 6)
    appends[5]["transcript"], appends[6]["transcript"] = "hello", "there"
    await client.send_all(appends)
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    await client.until("response.done")
    await client.send({"type": "session.heartbeat"})
    await client.until("session.heartbeat_ack")
    assert "error" not in [e["type"] for e in client.events], client.events
    return client, client.events


def one(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [e for e in events if e["type"] == kind]
    assert len(found) == 1, (kind, len(found))
    return found[0]


@pytest.mark.parametrize("lane", ["G", "D"])
def test_the_envelope_and_the_input_and_item_events(servers, lane) -> None:
    """§4.0 type + unique event_<32 hex> (and on D a rising server_event_seq after session.created);
    §4.3 committed {previous_item_id, item_id, event{input.committed record}}; §4.4 item added/created/
    done and the transcription.completed {item_id, content_index, transcript, usage}; §4.9 the
    hints make the transcript; §4.10 the user item object; §4.14 heartbeat_ack {session_id}."""
    async def scenario():
        client, events = await recorded_turn(servers[lane], lane)
        ids = [e["event_id"] for e in events]
        assert all(EVENT_ID.match(i) for i in ids) and len(set(ids)) == len(ids)
        if lane == "D":
            numbered = [e["server_event_seq"] for e in events[1:]]
            assert events[0]["type"] == "session.created" and "server_event_seq" not in events[0]
            assert numbered == list(range(numbered[0], numbered[0] + len(numbered)))
        session_id = events[0]["session"]["id"]
        committed = one(events, "input_audio_buffer.committed")
        item_id = committed["item_id"]
        assert committed["previous_item_id"] is None and re.match(r"^item_[0-9a-f]{32}$", item_id)
        record = committed["event"]
        assert {k: record[k] for k in ("type", "session_id", "turn_id", "epoch", "native_audio",
                                       "realtime_item_id")} == {
            "type": "input.committed", "session_id": session_id, "turn_id": 0, "epoch": 0, "native_audio": True,
            "realtime_item_id": item_id}
        assert record["history_len"] == 1
        user = [e for e in events if e["type"] in ("conversation.item.added", "conversation.item.created",
                                                   "conversation.item.done") and e["item"]["id"] == item_id]
        assert [e["type"] for e in user] == ["conversation.item.added", "conversation.item.created",
                                             "conversation.item.done"]
        item = user[-1]["item"]
        assert {k: item[k] for k in ("object", "type", "role", "status")} == {
            "object": "realtime.item", "type": "message", "role": "user", "status": "completed"}
        assert item["content"][0] == {"type": "input_audio", "transcript": "hello there"}
        assert all(e["previous_item_id"] is None for e in user)
        transcribed = one(events, "conversation.item.input_audio_transcription.completed")
        assert (transcribed["item_id"], transcribed["content_index"], transcribed["transcript"]) == (
            item_id, 0, "hello there")
        assert transcribed["usage"]["type"] == "duration" and transcribed["usage"]["seconds"] > 0
        assert events[-1] == {**events[-1], "type": "session.heartbeat_ack", "session_id": session_id}
        await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("lane", ["G", "D"])
def test_every_response_event_carries_its_fields(servers, lane) -> None:
    """§4.5 each response event's fields and addressing, §4.6 the delta report (format,
    sample_rate_hz constant, cumulative audio_duration_ms = floor(samples*1000/rate), playback),
    §4.7 item_<r> and output_index 0, §4.8 the response object (created and done), §4.10 the
    assistant item, rate_limits.updated []."""
    async def scenario():
        client, events = await recorded_turn(servers[lane], lane)
        created = one(events, "response.created")
        r = created["response"]["id"]
        item_id = f"item_{r}"
        assert created["response_id"] == r
        response = created["response"]
        assert {k: response[k] for k in ("object", "status", "status_details", "output", "max_output_tokens")} == {
            "object": "realtime.response", "status": "in_progress", "status_details": None, "output": [],
            "max_output_tokens": "inf"}
        assert response["conversation_id"] == f"conv_{events[0]['session']['id']}"
        assert response["output_modalities"] and response["audio"]["output"]["format"]
        assert response["modalities"] == ["text", "audio"]  # the beta key, kept for REF's clients
        added = one(events, "response.output_item.added")
        assert (added["response_id"], added["output_index"], added["item"]["id"]) == (r, 0, item_id)
        assert (added["item"]["role"], added["item"]["status"], added["item"]["content"]) == (
            "assistant", "in_progress", [])
        part = one(events, "response.content_part.added")
        assert {k: part[k] for k in ADDRESS} == {"response_id": r, "item_id": item_id, "output_index": 0,
                                                 "content_index": 0}
        assert part["part"] == {"type": "audio", "transcript": ""}
        deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
        samples = 0
        for delta in deltas:
            assert {k: delta[k] for k in ADDRESS} == {k: part[k] for k in ADDRESS}
            report = delta["vllm_omni"]
            assert (report["format"], report["sample_rate_hz"]) == ("pcm16", 24000)
            samples += len(base64.b64decode(delta["delta"], validate=True)) // 2
            assert report["audio_duration_ms"] == samples * 1000 // 24000
            assert set(report["playback"]) == PLAYBACK and report["session_id"] == events[0]["session"]["id"]
        said = [e for e in events if e["type"] == "response.output_audio_transcript.delta"]
        assert said and all({k: e[k] for k in ADDRESS} == {k: part[k] for k in ADDRESS} for e in said)
        text = "".join(e["delta"] for e in said)
        audio_done = one(events, "response.output_audio.done")
        assert {k: audio_done[k] for k in ADDRESS} == {k: part[k] for k in ADDRESS}
        assert one(events, "response.output_audio_transcript.done")["transcript"] == text
        assert one(events, "response.content_part.done")["part"] == {"type": "audio", "transcript": text}
        item = one(events, "response.output_item.done")["item"]
        assert (item["id"], item["status"], item["content"][0]["type"], item["content"][0]["transcript"]) == (
            item_id, "completed", "output_audio", text)
        assert item["content"][0]["audio_duration_ms"] == samples * 1000 // 24000
        done = one(events, "response.done")
        assert done["response_id"] == r and done["response"]["id"] == r
        final = done["response"]
        assert (final["status"], final["status_details"], final["output"]) == ("completed", None, [item])
        assert set(final["usage"]) == USAGE and final["usage"]["output_tokens"] > 0
        assert final["usage"]["total_tokens"] == final["usage"]["input_tokens"] + final["usage"]["output_tokens"]
        assert done["vllm_omni"]["stage_metrics"]["0"]["num_tokens_out"] > 0
        assert set(done["vllm_omni"]["playback"]) == PLAYBACK and done["vllm_omni"]["committed"] is True
        limits = events[events.index(done) + 1]
        assert (limits["type"], limits["rate_limits"]) == ("rate_limits.updated", [])
        await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("lane", ["G", "D"])
def test_item_operations_answer_with_their_fields(servers, lane) -> None:
    """§4.4 retrieved {item}, truncated {item_id, content_index, audio_end_ms, event{truncated}} and
    its playback.acknowledged (§4.13), deleted {item_id, event{deleted}}."""
    async def scenario():
        client, events = await recorded_turn(servers[lane], lane)
        r = one(events, "response.done")["response"]["id"]
        item_id = f"item_{r}"
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        assert (await client.until("conversation.item.retrieved"))[-1]["item"]["id"] == item_id
        await client.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                           "audio_end_ms": 100})
        truncated = (await client.until("conversation.item.truncated"))[-1]
        assert (truncated["item_id"], truncated["content_index"], truncated["audio_end_ms"]) == (item_id, 0, 100)
        assert truncated["event"]["type"] == "conversation.item.truncated" and truncated["event"]["truncated"]
        acked = (await client.until("playback.acknowledged"))[-1]["event"]
        assert {k: acked[k] for k in ("type", "item_id", "committed_ms", "truncate")} == {
            "type": "playback.acknowledged", "item_id": item_id, "committed_ms": 100, "truncate": True}
        assert set(acked["playback"]) == PLAYBACK and isinstance(acked["history_committed"], bool)
        await client.send({"type": "conversation.item.delete", "item_id": item_id})
        deleted = (await client.until("conversation.item.deleted"))[-1]
        assert deleted["item_id"] == item_id
        assert (deleted["event"]["type"], deleted["event"]["item_id"], deleted["event"]["deleted"]) == (
            "conversation.item.deleted", item_id, True)
        await client.close()

    asyncio.run(scenario())


async def opened(url: str, lane: str, **session: Any) -> Client:
    if lane == "G":
        client = await connect(url)
        assert (await client.next())["type"] == "session.created"
    else:
        client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}")
        assert [(await client.next())["type"] for _ in range(2)] == ["session.created", "session.updated"]
    await client.send({"type": "session.update", "session": {"turn_detection": None, **session}})
    await client.until("session.updated")
    return client


@pytest.mark.parametrize("lane", ["G", "D"])
def test_a_text_response_has_one_text_part(servers, lane) -> None:
    """§4.5 text-modality responses: a text part opened right before the first
    response.output_text.delta (content_index 0, no audio part), output_text.done with the
    concatenated text, content_part.done with it, and no audio events."""
    async def scenario():
        text_only = {"output_modalities": ["text"]} if lane == "G" else {"modalities": ["text"]}
        client = await opened(servers[lane], lane, **text_only)
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
        await client.send({"type": "input_audio_buffer.commit", "create_response": True})
        events = await client.until("response.done")
        await client.close()
        assert "error" not in [e["type"] for e in events], events
        kinds = [e["type"] for e in events]
        assert not [k for k in kinds if k.startswith("response.output_audio")]
        first = kinds.index("response.output_text.delta")
        part = events[first - 1]
        assert (part["type"], part["part"], part["content_index"]) == (
            "response.content_part.added", {"type": "text", "text": ""}, 0)
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert one(events, "response.output_text.done")["text"] == text
        assert one(events, "response.content_part.done")["part"] == {"type": "text", "text": text}
        assert kinds.index("response.output_text.done") < kinds.index("response.content_part.done") < \
            kinds.index("response.output_item.done")

    asyncio.run(scenario())


@pytest.mark.parametrize("lane", ["G", "D"])
def test_buffer_replies_and_the_session_end(servers, lane) -> None:
    """§4.1 input_audio_buffer.cleared for a clear and for input.cancel with nothing to cancel;
    §4.14 / §5.7 session.close → session.closed {session_id, reason:"client_close", event}, the last
    event, then close 1000."""
    async def scenario():
        client = await opened(servers[lane], lane)
        session_id = client.events[0]["session"]["id"]
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav"))[:3])
        for clear in ({"type": "input_audio_buffer.clear"}, {"type": "input.cancel"}):
            await client.send(clear)
            await client.until("input_audio_buffer.cleared")
        await client.send({"type": "session.close"})
        closed = (await client.until("session.closed"))[-1]
        assert (closed["session_id"], closed["reason"]) == (session_id, "client_close")
        assert isinstance(closed["event"], dict)
        await asyncio.wait_for(client.ws.wait_closed(), 10)
        assert client.ws.close_code == 1000 and client.events[-1] is closed
        assert "error" not in [e["type"] for e in client.events]
        await client.close()

    asyncio.run(scenario())


def test_idle_timeout_triggers_an_empty_turn_on_the_duplex_lane(servers) -> None:
    """§4.1 / §4.3 on the D lane: `idle_timeout_ms` after an answer →
    timeout_triggered {audio_start_ms, audio_end_ms, item_id} → C(X) for that item → a response."""
    async def scenario():
        client = await opened(servers["D"], "D", overlap_policy="listen_only")
        await client.send({"type": "session.update", "session": {
            "turn_detection": {"type": "server_vad", "idle_timeout_ms": 200}}})
        await client.until("session.updated")
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=1.5)))
        first = (await client.until("response.done"))[-1]["response"]
        played_s = first["output"][0]["content"][0]["audio_duration_ms"] / 1000
        idle = await client.until("response.done", timeout=played_s + 60)
        await client.close()
        assert "error" not in [e["type"] for e in idle]
        kinds = [e["type"] for e in idle]
        assert kinds.index("input_audio_buffer.timeout_triggered") < kinds.index("input_audio_buffer.committed") \
            < kinds.index("response.created")
        timeout = one(idle, "input_audio_buffer.timeout_triggered")
        assert one(idle, "input_audio_buffer.committed")["item_id"] == timeout["item_id"]
        assert isinstance(timeout["audio_start_ms"], int) and timeout["audio_end_ms"] >= timeout["audio_start_ms"]

    asyncio.run(scenario())
