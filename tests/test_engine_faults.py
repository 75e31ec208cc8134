"""Request accounting, stage death and multimodal limits on the torch backend: however a
request ends, no stage keeps counting it; a dead stage fails every request at once and
refuses new ones; a long spoken conversation stays within `limit_mm_per_prompt`."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from tests.conftest import read_fixture_pcm
from tests.engine_helpers import end_requests_every_way, long_request, make_engine, run_request, wait_until_idle
from tests.realtime_helpers import serving
from vllm_omni.config import get_deploy_config_path, load_deploy_config
from vllm_omni.engine import (
    AudioChunk,
    Message,
    OmniRequest,
    RequestError,
    RequestFinished,
    StageUnavailableError,
    TextDelta,
)
from vllm_omni.models.qwen3_omni.vllm_backend.thinker import VllmThinkerDriver


@pytest.fixture(scope="module")
def engine(tiny_loaded):
    built = make_engine(tiny_loaded)
    yield built
    built.shutdown()


def test_every_way_of_ending_a_request_leaves_no_stage_counting_it(engine) -> None:
    asyncio.run(end_requests_every_way(engine, rounds=5))
    assert engine.active_requests_by_stage() == {"thinker": 0, "talker": 0, "code2wav": 0}


def test_a_talker_that_ends_first_stops_the_thinker(engine) -> None:
    """The final record is out once code2wav is done; the thinker must not go on for nothing."""
    async def scenario():
        result = await run_request(engine, OmniRequest([Message("user", text="Go on and on.")], sampling={
            "thinker": {"max_tokens": 400, "ignore_eos": True}, "talker": {"max_tokens": 3}}))
        assert result["final"].finish_reason == "stop"
        await wait_until_idle(engine, 1.0)

    asyncio.run(scenario())


async def _start(engine, request: OmniRequest, until: type | None) -> tuple[asyncio.Task, list]:
    """Consume `request` in a task; return once an output of type `until` arrived (None: once admitted)."""
    outputs: list = []

    async def consume() -> None:
        async for output in engine.generate(request):
            outputs.append((time.monotonic(), output))

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    while until is not None and not any(isinstance(o, until) for _, o in outputs):
        assert not task.done(), outputs
        await asyncio.sleep(0.005)
    return task, outputs


def test_a_dead_stage_fails_every_request_and_refuses_new_ones(tiny_loaded) -> None:
    async def scenario(doomed):
        mid_audio = await _start(doomed, long_request(talker=400), until=AudioChunk)
        mid_text = await _start(doomed, long_request(thinker=400), until=TextDelta)
        just_sent = await _start(doomed, long_request(), until=None)
        doomed.workers["talker"].stop()  # the talker's worker thread ends: the stage is dead
        died = time.monotonic()
        for task, outputs in (mid_audio, mid_text, just_sent):
            await asyncio.wait_for(task, 2)
            at, final = outputs[-1]
            assert isinstance(final, RequestFinished) and final.finish_reason == "error"
            assert final.error_code == "stage_unavailable" and "talker (stage_id 1)" in final.error
            assert at - died < 2.0
        await wait_until_idle(doomed, 1.0)
        began = time.monotonic()
        with pytest.raises(StageUnavailableError, match=r"talker \(stage_id 1\)") as refused:
            async for _ in doomed.generate(long_request()):
                pass
        # Refused at admission, not after a wait: 1 s holds on a loaded 2-core machine.
        assert time.monotonic() - began < 1.0 and refused.value.code == "stage_unavailable"

    with serving(make_engine(tiny_loaded)) as (url, doomed, _):
        asyncio.run(scenario(doomed))
        base = url.replace("ws://", "http://")
        health = httpx.get(base + "/health")
        assert health.status_code == 503 and health.json()["dead_stages"] == ["talker"]
        assert health.json()["stage_active_requests"] == {"thinker": 0, "talker": 0, "code2wav": 0}
        scraped = httpx.get(base + "/metrics").text
        assert 'vllm_omni_stage_active_requests{replica="0",stage="talker"} 0.0' in scraped
        assert 'vllm_omni_stage_replica_up{replica="0",stage="talker"} 0.0' in scraped


def spoken_conversation(turns: int, seconds: float = 0.5) -> list[Message]:
    clip = read_fixture_pcm("speech_en_single.wav")[: int(16000 * seconds)]
    messages = [Message("system", text="You are a helpful assistant.")]
    for i in range(turns - 1):
        messages += [Message("user", audio=clip), Message("assistant", text=f"Answer {i}.")]
    return messages + [Message("user", audio=clip)]


def test_more_spoken_turns_than_the_audio_limit(engine) -> None:
    limit = engine.deploy.stage_by_role("thinker").engine_args.mm_limit("audio")
    request = OmniRequest(spoken_conversation(limit + 1),
                          sampling={"thinker": {"max_tokens": 4}, "talker": {"max_tokens": 8}})
    result = asyncio.run(run_request(engine, request))
    assert result["final"].finish_reason in ("stop", "length") and len(result["pcm"]) > 0
    assert engine.family.last_render[1] == limit + 1 - max(1, limit // 4)  # a quarter of the limit went


def test_oldest_turns_lose_their_audio_first(tiny_loaded) -> None:
    narrow = make_engine(tiny_loaded, audio_limit=2)
    try:
        clip = read_fixture_pcm("speech_en_single.wav")[:8000]
        messages = [Message("system", text="Be brief."),
                    Message("user", audio=clip, text="first"), Message("assistant", text="one"),
                    Message("user", audio=clip), Message("assistant", text="two"),
                    Message("user", audio=clip), Message("assistant", text="three"),
                    Message("user", audio=clip, text="now")]
        result = asyncio.run(run_request(narrow, OmniRequest(messages, modalities=("text",),
                                                             sampling={"thinker": {"max_tokens": 4}})))
        assert result["final"].finish_reason in ("stop", "length")
        rendered, audio_items = narrow.family.last_render
        assert audio_items == 2
        # The first turn keeps its text, the audio-only second turn is gone, the rest stay.
        assert [m["role"] for m in rendered] == ["system", "user", "assistant", "assistant", "user", "assistant",
                                                 "user"]
        assert rendered[1]["content"] == [{"type": "text", "text": "first"}]
        assert [p["type"] for p in rendered[4]["content"]] == ["audio"]
    finally:
        narrow.shutdown()


def test_current_turn_alone_over_the_audio_limit_is_refused(tiny_loaded) -> None:
    deaf = make_engine(tiny_loaded, audio_limit=0)
    try:
        request = OmniRequest([Message("user", audio=np.zeros(16000, np.float32))])
        with pytest.raises(RequestError, match="limit_mm_per_prompt"):
            asyncio.run(run_request(deaf, request))
        earlier_audio = [Message("user", audio=np.zeros(16000, np.float32)), Message("assistant", text="Hm?"),
                         Message("user", text="Just text.")]
        text_only = asyncio.run(run_request(deaf, OmniRequest(earlier_audio, sampling={
            "thinker": {"max_tokens": 4}, "talker": {"max_tokens": 8}})))
        assert text_only["final"].finish_reason in ("stop", "length")
        rendered, audio_items = deaf.family.last_render
        assert audio_items == 0 and [m["role"] for m in rendered] == ["assistant", "user"]
    finally:
        deaf.shutdown()


@pytest.mark.parametrize(("configured", "passed", "audio_limit"), [
    ({"audio": 16, "image": 0, "video": 0}, {"audio": 16, "image": 0, "video": 0}, 16),
    ({"audio": 2}, {"audio": 2, "video": 0}, 2),
    ({}, {"video": 0}, 999),  # audio and image unlisted: vLLM's default, which the engine applies too
])
def test_the_vllm_thinker_gets_the_limit_the_engine_applies(tiny_loaded, configured, passed, audio_limit) -> None:
    stage = load_deploy_config(get_deploy_config_path("qwen3_omni_tiny_cpu"), platform="cpu").stage_by_role("thinker")
    stage = stage.model_copy(update={"engine_args": stage.engine_args.model_copy(
        update={"limit_mm_per_prompt": configured})})
    assert VllmThinkerDriver(tiny_loaded, stage).engine_kwargs()["limit_mm_per_prompt"] == passed
    assert stage.engine_args.mm_limit("audio") == audio_limit
