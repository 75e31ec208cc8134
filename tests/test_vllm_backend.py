"""Thinker and talker on real vLLM CPU engines: same tokens, same codec ids, same audio as
transformers, with async_chunk on and off; batching, abort, bad input, request accounting,
long spoken conversations, the realtime scenarios, and dying engines. One pair of engines
serves the whole session (`vllm_engine` in conftest.py; each start takes about a minute
here); the dead-engine test kills them one at a time (they restart), so it runs last."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import jsonschema
import numpy as np
import pytest

from tests.engine_helpers import async_chunk_set_to, end_requests_every_way, run_request
from tests.fault_helpers import engine_core_pid, kill_during_request, wait_until_healthy
from tests.test_engine_faults import spoken_conversation
from tests.test_pipeline_parity import CASES, engine_request, reference  # noqa: F401  (fixture)
from vllm_omni.engine import AudioChunk, Message, OmniRequest, RequestError
from vllm_omni.models.qwen3_omni.vllm_backend.talker import VllmTalkerDriver
from vllm_omni.models.qwen3_omni.vllm_backend.thinker import VllmThinkerDriver, collapse_placeholders


@pytest.fixture(scope="module")
def served(vllm_engine):
    """(ws URL, engine, app): the session's vLLM engines behind the realtime server."""
    from tests.realtime_helpers import serving

    with serving(vllm_engine, borrowed=True) as (url, engine, app):  # later modules use the engines too
        yield url, engine, app


def test_both_stages_run_on_vllm_engine(vllm_engine) -> None:
    drivers = {role: stage.replicas[0].driver for role, stage in vllm_engine.workers.items()
               if hasattr(stage.replicas[0], "driver")}
    assert isinstance(drivers["thinker"], VllmThinkerDriver)
    assert isinstance(drivers["talker"], VllmTalkerDriver)


def test_engines_run_at_the_stages_nice_and_the_server_does_not(vllm_engine) -> None:
    """The served CPU config lowers both engines' OS priority (`nice` 10), so the server's
    code2wav and sockets win a busy core; the server process itself keeps its own."""
    for role in ("thinker", "talker"):
        nice = vllm_engine.deploy.stage_by_role(role).nice
        assert os.getpriority(os.PRIO_PROCESS, engine_core_pid(vllm_engine, role)) == os.nice(0) + nice


@pytest.mark.parametrize("async_chunk", [True, False], ids=["async_chunk", "sync"])
@pytest.mark.parametrize("case", list(CASES))
def test_vllm_stages_equal_transformers(case: str, async_chunk: bool, reference, vllm_engine) -> None:  # noqa: F811
    expected = reference(case)
    with async_chunk_set_to(vllm_engine, async_chunk):
        ours = asyncio.run(run_request(vllm_engine, engine_request(case)))
    assert ours["final"].error is None
    assert list(ours["final"].token_ids) == expected["tokens"]
    assert np.array_equal(ours["codes"], expected["codes"])
    assert ours["pcm"].shape == expected["one_shot_pcm"].shape
    assert np.abs(ours["pcm"] - expected["one_shot_pcm"]).max() <= 1


def test_concurrent_requests_and_abort_on_vllm(vllm_engine) -> None:
    async def scenario():
        requests = [engine_request(case) for case in CASES]
        solo = await run_request(vllm_engine, engine_request("text"))
        victim = OmniRequest([Message("user", text="A long story please.")],
                             sampling={"thinker": {"max_tokens": 200}, "talker": {"max_tokens": 200}})
        stream = vllm_engine.generate(victim)
        async for output in stream:  # abort mid-speech: the talker has a running request
            if isinstance(output, AudioChunk):
                break
        assert await vllm_engine.abort(victim.request_id)
        together = await asyncio.gather(*(run_request(vllm_engine, r) for r in requests))
        assert together[0]["final"].token_ids == solo["final"].token_ids
        assert np.array_equal(together[0]["codes"], solo["codes"])  # batched talker steps = solo steps
        assert np.array_equal(together[0]["pcm"], solo["pcm"])
        errors = [r["final"].error for r in together]
        assert all(r["final"].finish_reason in ("stop", "length") for r in together), errors
        await stream.aclose()
        for _ in range(100):
            if vllm_engine.num_active_requests() == 0:
                break
            await asyncio.sleep(0.05)
        assert vllm_engine.num_active_requests() == 0

    asyncio.run(scenario())


BAD_REQUESTS = {
    "thinker max_tokens": (OmniRequest([Message("user", text="hi")], sampling={"thinker": {"max_tokens": 0}}),
                           "max_tokens"),
    "talker max_tokens": (OmniRequest([Message("user", text="hi")], sampling={"talker": {"max_tokens": 0}}),
                          "max_tokens"),
    "speaker": (OmniRequest([Message("user", text="hi")], speaker="nobody"), "speaker"),
    "empty audio": (OmniRequest([Message("user", audio=np.zeros(0, dtype=np.float32))]), "audio"),
}


@pytest.mark.parametrize("bad", list(BAD_REQUESTS))
def test_bad_input_on_vllm_fails_only_that_request(bad: str, vllm_engine) -> None:
    request, message = BAD_REQUESTS[bad]

    async def scenario():
        with pytest.raises(RequestError, match=message):
            async for _ in vllm_engine.generate(request):
                pass
        good = await run_request(vllm_engine, engine_request("text"))
        assert good["final"].finish_reason in ("stop", "length")

    asyncio.run(scenario())


def test_a_forced_tool_call_is_json_of_the_tools_schema_and_nothing_is_spoken(vllm_engine) -> None:
    """tool_choice names a function: vLLM's structured outputs constrain the thinker to a call
    of it whose arguments match its schema; the call is the answer (no text, no audio)."""
    city = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
            "additionalProperties": False}
    tools = [{"name": "get_weather", "parameters": city}, {"name": "get_time", "parameters": city}]
    # the tiny tokenizer spells JSON about a character a token
    request = OmniRequest([Message("user", text="Weather in Paris?")], tools=tools, tool_choice="get_weather",
                          sampling={"thinker": {"max_tokens": 200}})
    result = asyncio.run(run_request(vllm_engine, request))
    final = result["final"]
    assert final.finish_reason == "stop" and [c.name for c in final.tool_calls] == ["get_weather"]
    jsonschema.validate(json.loads(final.tool_calls[0].arguments), city)
    assert result["text"] == "" and len(result["pcm"]) == 0 and final.usage.audio_tokens == 0


def test_placeholders_collapse_per_item() -> None:
    pad, image = 7, 8
    assert collapse_placeholders([1, pad, pad, pad, 2, pad, pad, 3], (pad, image)) == [1, pad, 2, pad, 3]
    assert collapse_placeholders([1, image, image, 2, pad, pad, 3, image], (pad, image)) == [1, image, 2, pad, 3, image]


def test_server_vad_two_turns_on_vllm(served) -> None:
    from tests.realtime_helpers import append_events, connect, fixture_pcm
    from tests.test_realtime_ga_lane import SERVER_VAD_UPDATE, check_s2_turn

    async def scenario():
        client = await connect(served[0])
        await client.next()
        await client.send(SERVER_VAD_UPDATE)
        await client.until("session.updated")
        ids = []
        for fixture in ("speech_en_single.wav", "speech_with_pause.wav"):
            await client.send_all(append_events(fixture_pcm(fixture, trailing_silence_s=1.5)))
            turn = await client.until("response.done", timeout=180)
            ids.append(check_s2_turn([e for e in turn if e["type"] != "rate_limits.updated"]))
        await client.close()
        assert ids[0] != ids[1]

    asyncio.run(scenario())


def test_legacy_smoke_on_vllm(served) -> None:
    from tests.test_realtime_legacy_lane import check_legacy_output, legacy_turn

    client, result = asyncio.run(legacy_turn(served[0], delay=0.02))
    check_legacy_output(client, result)


def test_eight_sessions_three_turns_on_vllm(served) -> None:
    """Found under load: later turns carry several audio items, and the prefills of
    sessions that commit together share one vLLM encoder batch."""
    from tests.test_realtime_load import check_concurrent_sessions

    check_concurrent_sessions(*served)


def test_every_way_of_ending_a_request_on_vllm_leaves_no_stage_counting_it(served) -> None:
    """Found in production: cancels right after the submit left the thinker counting requests."""
    url, engine, _ = served
    asyncio.run(end_requests_every_way(engine, rounds=2))
    held = {role: asyncio.run_coroutine_threadsafe(worker.driver.held_requests(), worker._loop).result(30)
            for role, stage in engine.workers.items() for worker in stage.replicas if hasattr(worker, "driver")}
    assert held == {"thinker": 0, "talker": 0}  # vLLM's own tables and ours in its worker processes
    health = httpx.get(url.replace("ws://", "http://") + "/health").json()
    assert health["active_requests"] == 0
    assert health["stage_active_requests"] == {"thinker": 0, "talker": 0, "code2wav": 0}


def test_more_spoken_turns_than_the_audio_limit_on_vllm(vllm_engine) -> None:
    """vLLM refuses a prompt with more audio items than limit_mm_per_prompt."""
    limit = vllm_engine.deploy.stage_by_role("thinker").engine_args.mm_limit("audio")
    request = OmniRequest(spoken_conversation(limit + 1),
                          sampling={"thinker": {"max_tokens": 4}, "talker": {"max_tokens": 8}})
    result = asyncio.run(run_request(vllm_engine, request))
    assert result["final"].finish_reason in ("stop", "length"), result["final"].error
    assert vllm_engine.family.last_render[1] == limit + 1 - max(1, limit // 4)  # a quarter of the limit went


KILLS = (("thinker", "before_output"), ("talker", "mid_audio"), ("thinker", "talker_only"))


def test_killed_engines_fail_their_requests_and_restart(vllm_engine) -> None:
    """SIGKILLs one EngineCore at a time, at three points of a request; each time the
    request fails within 2 s naming the stage, new requests are refused at once, nothing
    stays counted, and the stage restarts (restart_on_failure). The shared engine is left
    healthy for later modules even when an assertion fails."""
    engine = vllm_engine

    async def scenario():
        for role, point in KILLS:
            outcome = await kill_during_request(engine, role, point)
            stage_id = engine.deploy.stage_by_role(role).stage_id
            final = outcome.final
            assert final.finish_reason == "error" and final.error_code == "stage_unavailable", final
            assert f"{role} (stage_id {stage_id})" in final.error
            assert outcome.kill_to_final_s < 2.0, outcome
            assert outcome.outputs_before_kill == 0 or point != "before_output"
            # refused at admission, not after a wait (1 s holds on a loaded 2-core machine)
            assert outcome.refusal_s < 1.0 and f"{role} (stage_id {stage_id})" in str(outcome.refusal)
            await wait_until_healthy(engine, 300)
        after = await run_request(engine, engine_request("text"))
        assert after["final"].finish_reason in ("stop", "length"), after["final"].error

    try:
        asyncio.run(asyncio.wait_for(scenario(), 1200))
    finally:
        asyncio.run(wait_until_healthy(engine, 300))
