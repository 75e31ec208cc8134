"""Long use against a real server (torch config, tiny checkpoint): cancels and barge-ins
across sessions leave no engine request behind, and one long server-VAD conversation
keeps working with bounded memory."""

from __future__ import annotations

import asyncio
import time

import psutil

from tests.realtime_helpers import append_events, connect, fixture_pcm, running_server
from tests.test_realtime_fuzz import counts, spoken_turn, wait_for_zero

SESSIONS = 8
CANCELS_PER_SESSION = 13  # 104 in all
BARGE_INS_PER_SESSION = 4  # 32 in all
SOAK_TURNS = 12
BARGE_IN_UPDATE = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
    "type": "server_vad", "interrupt_response": True, "create_response": False}}}}}
SERVER_VAD = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
    "type": "server_vad", "interrupt_response": True}}}}}


async def ask_text(client, text: str = "Tell me a long story.") -> None:
    await client.send({"type": "conversation.item.create",
                       "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await client.until("conversation.item.done")


async def cancel_right_after_create(client) -> str:
    await client.send({"type": "response.create"})
    await client.send({"type": "response.cancel"})
    return (await client.until("response.done", timeout=60))[-1]["response"]["status"]


async def barge_in(client, speech: list[dict]) -> tuple[str, bool]:
    """A response, then the user starts speaking over it at once."""
    await client.send({"type": "response.create"})
    await client.until("response.created")
    await client.send_all(speech)
    events = await client.until("response.done", timeout=60)
    decided = any(e["type"] == "overlap.decision" and e["action"] == "barge_in" for e in events)
    await client.send({"type": "input_audio_buffer.clear"})
    await client.until("input_audio_buffer.cleared")
    return events[-1]["response"]["status"], decided


async def cancels_and_barge_ins(url: str) -> tuple[list[str], list[tuple[str, bool]]]:
    client = await connect(url)
    await client.next()
    await client.send(BARGE_IN_UPDATE)
    await client.until("session.updated")
    speech = append_events(fixture_pcm("speech_en_single.wav"))
    cancelled, barged = [], []
    for _ in range(CANCELS_PER_SESSION):
        await ask_text(client)
        cancelled.append(await cancel_right_after_create(client))
    for _ in range(BARGE_INS_PER_SESSION):
        await ask_text(client)
        barged.append(await barge_in(client, speech))
    await client.close()
    return cancelled, barged


def test_cancels_and_barge_ins_leave_no_engine_request(tiny_loaded) -> None:
    with running_server(tiny_loaded, {}) as (url, engine, _):
        async def scenario():
            results = await asyncio.gather(*(cancels_and_barge_ins(url) for _ in range(SESSIONS)))
            last_done = time.monotonic()
            cancelled = [status for c, _ in results for status in c]
            barged = [b for _, bs in results for b in bs]
            assert cancelled.count("cancelled") == SESSIONS * CANCELS_PER_SESSION
            assert all(status == "cancelled" and decided for status, decided in barged), barged
            assert await wait_for_zero(url, timeout=1.0) == (0, 0)
            assert time.monotonic() - last_done <= 1.0
            assert engine.active_requests_by_stage() == {role: 0 for role in engine.workers}

        asyncio.run(scenario())


def test_twelve_spoken_turns_then_cancels_and_barge_ins(tiny_loaded) -> None:
    """One long session: memory growth is reported and bounded, everything ends with it."""
    process = psutil.Process()
    short_answers = {"stages.0.default_sampling_params.max_tokens": 16,
                     "stages.1.default_sampling_params.max_tokens": 64}  # the turns count here, not their length
    with running_server(tiny_loaded, short_answers) as (url, _, _):
        async def scenario():
            client = await connect(url)
            await client.next()
            await client.send(SERVER_VAD)
            await client.until("session.updated")
            rss = [process.memory_info().rss]
            for _ in range(SOAK_TURNS):
                await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=1.5)))
                done = (await client.until("response.done", timeout=120))[-1]
                assert done["response"]["status"] == "completed", done["response"]["status_details"]
                rss.append(process.memory_info().rss)
            await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
            await client.until("session.updated")
            for _ in range(5):
                await ask_text(client)
                assert await cancel_right_after_create(client) == "cancelled"
            await client.send(BARGE_IN_UPDATE)
            await client.until("session.updated")
            speech = append_events(fixture_pcm("speech_en_single.wav"))
            for _ in range(5):
                await ask_text(client)
                assert await barge_in(client, speech) == ("cancelled", True)
            await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
            await client.until("session.updated")
            await spoken_turn(client)
            await client.close()
            assert await wait_for_zero(url) == (0, 0)
            growth_mb = (rss[-1] - rss[1]) / 2**20  # after the first turn warmed everything up
            print(f"\nsoak: RSS after turn 1 {rss[1] / 2**20:.0f} MiB, after turn {SOAK_TURNS} "
                  f"{rss[-1] / 2**20:.0f} MiB (+{growth_mb:.1f} MiB)")
            assert growth_mb < 200

        asyncio.run(scenario())


def test_a_dead_stage_fails_the_response_and_refuses_the_next_at_once(tiny_loaded) -> None:
    """The talker's worker dies mid-answer: the client hears `error` (stage_unavailable, the
    stage named) and `response.done` failed within 2 s; the next response is refused at once
    with the same code; nothing stays counted."""
    with running_server(tiny_loaded, {}) as (url, engine, _):
        async def scenario():
            client = await connect(url)
            await client.next()
            await ask_text(client)
            await client.send({"type": "response.create"})
            await client.until("response.output_audio.delta", timeout=60)
            engine.workers["talker"].stop()
            died = time.monotonic()
            events = await client.until("response.done", timeout=10)
            errors = [e["error"] for e in events if e["type"] == "error"]
            assert events[-1]["_t"] - died < 2.0
            assert events[-1]["response"]["status"] == "failed"
            assert [e["code"] for e in errors] == ["stage_unavailable"] and "talker" in errors[0]["message"]
            await ask_text(client)
            asked = time.monotonic()
            await client.send({"type": "response.create"})
            events = await client.until("response.done", timeout=10)
            assert events[-1]["_t"] - asked < 1.0 and events[-1]["response"]["status"] == "failed"
            assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["stage_unavailable"]
            await client.close()
            deadline = time.monotonic() + 5
            while (engine.num_active_requests() or counts(url)[0]) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert engine.num_active_requests() == 0 and counts(url)[0] == 0

        asyncio.run(scenario())
