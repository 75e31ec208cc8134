"""Whole recorded connections checked against the wire orderings (docs/realtime-api.md, and
docs/conformance.md §5): the commit fan-out C(X) and the response sequence R(r) of every turn, on
the GA lane and on the turn-based duplex lane, for completed, cancelled, cleared, barged-in and
deferred responses."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from tests.realtime_helpers import MODEL_NAME, Client, append_events, connect, fixture_pcm, running_server
from tests.spec_sequences import check_recording, check_transcript_pairs

VAD = {"type": "server_vad"}


@pytest.fixture(scope="module")
def servers(turn_model):
    overrides = {"stages.1.default_sampling_params.max_tokens": 64,
                 "stages.1.default_sampling_params.min_tokens": 40}
    with running_server(turn_model, overrides) as (ga_url, _, _), \
            running_server(turn_model, overrides, session_mode="duplex") as (duplex_url, _, _):
        yield ga_url, duplex_url


async def ga_session(url: str, turn_detection: dict | None, extensions: bool = True) -> Client:
    client = await connect(url, extensions=extensions)
    assert (await client.next())["type"] == "session.created"
    await client.send({"type": "session.update", "session": {
        "model": MODEL_NAME, "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                                 "turn_detection": turn_detection}}}})
    assert (await client.next())["type"] == "session.updated"
    return client


async def duplex_session(url: str, **session) -> Client:
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}")
    assert [(await client.next())["type"] for _ in range(2)] == ["session.created", "session.updated"]
    await client.send({"type": "session.update", "session": {"input_audio_format": "pcm16", **session}})
    assert (await client.until("session.updated"))[-1]["type"] == "session.updated"
    return client


async def manual_turn(client: Client) -> list[dict]:
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    return await client.until("response.done")


async def settle(client: Client) -> list[dict]:
    """Everything still owed (the last rate_limits.updated) before the checker reads the recording."""
    await client.send({"type": "session.heartbeat"})
    return await client.until("session.heartbeat_ack")


@pytest.mark.parametrize("extensions", [True, False])
def test_ga_manual_commit_turns_follow_c_and_r(servers, extensions) -> None:
    """§5.1: commit → C(X); response.create → R(r) completed; twice, ids distinct."""
    async def scenario():
        client = await ga_session(servers[0], None, extensions)
        for _ in range(2):
            turn = await manual_turn(client)
            assert turn[-1]["response"]["status"] == "completed"
        if extensions:
            await settle(client)
        else:
            await client.send({"type": "input_audio_buffer.clear"})
            await client.until("input_audio_buffer.cleared")
        check_recording(client.events)
        created = [e["response"] for e in client.events if e["type"] == "response.created"]
        assert all(r["status"] == "in_progress" and r["output"] == [] for r in created)
        await client.close()

    asyncio.run(scenario())


def test_ga_server_vad_turns_follow_c_and_r(servers) -> None:
    """§5.2: the auto-committed turns are C(X) without a second speech_stopped, then R(r)."""
    async def scenario():
        client = await ga_session(servers[0], VAD)
        for fixture in ("speech_en_single.wav", "speech_with_pause.wav"):
            await client.send_all(append_events(fixture_pcm(fixture, trailing_silence_s=1.5)))
            await client.until("response.done")
        await settle(client)
        check_recording(client.events)
        stopped = [e for e in client.events if e["type"] == "input_audio_buffer.speech_stopped"]
        assert len(stopped) == 2 and len({e["item_id"] for e in stopped}) == 2
        await client.close()

    asyncio.run(scenario())


async def interrupted_turn(client: Client, stop: dict) -> tuple[str, list[dict]]:
    """A committed spoken turn whose answer `stop` interrupts at its first audio delta: the
    response id and the events up to its response.done."""
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    response_id = (await client.until("response.output_audio.delta"))[-1]["response_id"]
    await client.send(stop)
    return response_id, await client.until("response.done")


def test_ga_cancel_and_clear_end_with_the_done_block(servers) -> None:
    """§5.4: response.cancel and output_audio_buffer.clear give the *.done block, then a cancelled
    response.done with the reason; clear answers output_audio_buffer.cleared first."""
    async def scenario():
        client = await ga_session(servers[0], None)
        reasons = []
        for stop in ({"type": "response.cancel"}, {"type": "output_audio_buffer.clear"}):
            response_id, tail = await interrupted_turn(client, stop)
            done = tail[-1]["response"]
            assert done["id"] == response_id and done["status"] == "cancelled"
            assert done["output"][0]["status"] == "incomplete"
            reasons.append(done["status_details"])
            if stop["type"] == "output_audio_buffer.clear":
                kinds = [e["type"] for e in tail]
                cleared = kinds.index("output_audio_buffer.cleared")
                assert tail[cleared]["response_id"] == response_id
                assert cleared < kinds.index("response.output_item.done")
        assert reasons == [{"type": "cancelled", "reason": "client_cancelled"},
                           {"type": "cancelled", "reason": "output_audio_buffer_clear"}]
        await settle(client)
        check_recording(client.events)
        await client.close()

    asyncio.run(scenario())


def test_ga_barge_in_is_a_cancelled_tail_then_the_next_turn(servers) -> None:
    """§5.3.1: speech over a generating response → speech_started, overlap.decision barge_in,
    the R(r) tail cancelled with turn_detected, then C(Y) and R(r2)."""
    async def scenario():
        client = await ga_session(servers[0], {**VAD, "interrupt_response": True})
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=1.0)))
        first = (await client.until("response.created"))[-1]["response"]["id"]
        await client.send_all(append_events(fixture_pcm("speech_with_pause.wav", trailing_silence_s=1.0)))
        cut = await client.until("response.done")
        kinds = [e["type"] for e in cut]
        onset = kinds.index("input_audio_buffer.speech_started", kinds.index("response.created")
                            if "response.created" in kinds else 0)
        decision = next(e for e in cut[onset:] if e["type"] == "overlap.decision")
        assert (decision["action"], decision["reason"]) == ("barge_in", "server_vad_speech_started")
        assert cut[-1]["response"]["id"] == first
        assert cut[-1]["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
        assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"
        await settle(client)
        check_recording(client.events)
        await client.close()

    asyncio.run(scenario())


def test_ga_speech_during_an_answer_is_deferred_behind_it(servers) -> None:
    """§5.3.2: interrupt_response false: the second turn is committed as C(Y) with
    overlap_deferred, r completes, and the response for Y starts right after r's response.done."""
    async def scenario():
        client = await ga_session(servers[0], VAD)
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=0.8)))
        first = (await client.until("response.created"))[-1]["response"]["id"]
        await client.send_all(append_events(fixture_pcm("speech_with_pause.wav", trailing_silence_s=0.8)))
        events = await client.until("response.done")
        assert events[-1]["response"] == {**events[-1]["response"], "id": first, "status": "completed"}
        committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
        assert committed and committed[-1]["event"]["overlap_deferred"] is True
        assert committed[-1]["event"]["response_create_deferred"] is True
        rest = await client.until("response.done")
        assert [e["type"] for e in rest[:2]] == ["rate_limits.updated", "response.created"]
        assert rest[-1]["response"]["status"] == "completed"
        await settle(client)
        check_recording(client.events)
        await client.close()

    asyncio.run(scenario())


def test_duplex_lane_turns_cancels_and_barge_in_follow_c_and_r(servers) -> None:
    """§5.1/§5.4/§5.3.1 on the turn-based duplex lane: a completed turn, a cancelled one, a cleared
    one and a client barge-in, each C(X) + R(r)."""
    async def scenario():
        client = await duplex_session(servers[1], turn_detection=None, playback_commit_policy="commit_all_on_done")
        assert (await manual_turn(client))[-1]["response"]["status"] == "completed"
        for stop in ({"type": "response.cancel"}, {"type": "output_audio_buffer.clear"}, {"type": "input.cancel"}):
            response_id, tail = await interrupted_turn(client, stop)
            assert tail[-1]["response"]["status"] == "cancelled"
            if stop["type"] == "output_audio_buffer.clear":
                kinds = [e["type"] for e in tail]
                assert tail[kinds.index("output_audio_buffer.cleared")]["response_id"] == response_id
                assert kinds.index("output_audio_buffer.cleared") < kinds.index("response.output_item.done")
        await settle(client)
        check_recording(client.events, lane="D")
        await client.send({"type": "session.close"})
        closed = await client.until("session.closed")
        assert closed[-1]["reason"] == "client_close"
        await client.close()

    asyncio.run(scenario())


def test_duplex_lane_server_vad_turns_follow_c_and_r(servers) -> None:
    """§5.2 on the duplex lane: server-VAD turns, each exactly one speech segment, commit and response."""
    async def scenario():
        client = await duplex_session(servers[1], turn_detection=json.loads(json.dumps(VAD)),
                                      overlap_policy="listen_only")
        for fixture in ("speech_en_single.wav", "speech_with_pause.wav"):
            await client.send_all(append_events(fixture_pcm(fixture, trailing_silence_s=1.5)))
            await client.until("response.done")
        await settle(client)
        check_recording(client.events, lane="D")
        kinds = [e["type"] for e in client.events]
        assert kinds.count("input_audio_buffer.committed") == kinds.count("response.created") == 2
        await client.close()

    asyncio.run(scenario())


@pytest.mark.xfail(strict=True, reason=(
    "issue 36: on the turn-based duplex lane an audio delta is not followed by exactly one "
    "response.output_audio_transcript.delta (spec §4.5 keeps REF's pairing on the D lane)"))
def test_duplex_lane_every_audio_delta_has_its_transcript_delta(servers) -> None:
    """§4.5 (D lane): each response.output_audio.delta is followed by one transcript delta,
    empty when that chunk had no new text."""
    async def scenario():
        client = await duplex_session(servers[1], turn_detection=None)
        turn = await manual_turn(client)
        await client.close()
        assert turn[-1]["response"]["status"] == "completed"
        check_transcript_pairs(turn)

    asyncio.run(scenario())


def test_duplex_lane_overlap_rules_decide_each_append_over_an_answer(servers) -> None:
    """§6.7 on a commit-driven duplex session (no server VAD): each append while the answer
    generates gets one overlap.decision by the first matching rule — overlap_action listen (2'),
    drop (2''), force_listen (5), silence (6), a back-channel transcript (7), plain speech under
    listen_only (8) — and none of them stops the answer, which stays one R(r)."""
    speech = append_events(fixture_pcm("speech_en_single.wav"))[10]
    silent = {**speech, "audio": base64.b64encode(b"\0\0" * 1600).decode()}
    cases = [({**speech, "overlap_action": "listen"}, "listen", "client_overlap_action"),
             ({**speech, "overlap_action": "drop"}, "drop", "client_overlap_action"),
             ({**speech, "force_listen": True}, "listen", "client_force_listen"),
             (silent, "drop", "silence_or_noise"),
             ({**speech, "transcript": "ok"}, "listen", "short_ack_transcript"),
             (speech, "listen", "policy_listen_only")]

    async def scenario():
        client = await duplex_session(servers[1], turn_detection=None, overlap_policy="listen_only")
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav")))
        await client.send({"type": "input_audio_buffer.commit", "create_response": True})
        await client.until("response.created")
        await client.send_all([append for append, _, _ in cases])
        events = await client.until("response.done")
        decisions = [(e["action"], e["reason"]) for e in events if e["type"] == "overlap.decision"]
        assert decisions == [(action, reason) for _, action, reason in cases]
        assert events[-1]["response"]["status"] == "completed"
        await settle(client)
        check_recording(client.events, lane="D")
        await client.close()

    asyncio.run(scenario())


def test_ga_a_deferred_turn_behind_a_cancelled_response_waits_for_response_create(servers) -> None:
    """§5.3.2: when r is cancelled, the turn deferred behind it stays committed but unanswered
    until response.create."""
    async def scenario():
        client = await ga_session(servers[0], VAD)
        await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=0.8)))
        await client.until("response.created")
        await client.send_all(append_events(fixture_pcm("speech_with_pause.wav", trailing_silence_s=0.8)))
        committed = (await client.until("input_audio_buffer.committed"))[-1]
        assert committed["event"]["overlap_deferred"] is True
        await client.send({"type": "response.cancel"})
        assert (await client.until("response.done"))[-1]["response"]["status"] == "cancelled"
        await asyncio.sleep(1.0)
        assert "response.created" not in [e["type"] for e in await settle(client)]
        await client.send({"type": "response.create"})
        assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"
        await client.close()

    asyncio.run(scenario())
