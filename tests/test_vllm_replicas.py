"""Two replicas of the thinker on real vLLM engines (and one talker engine): requests spread
over both and give the torch reference's tokens and PCM; a session's next turn returns to the
replica whose prefix cache holds its conversation; killing one replica's engine fails only the
request on it, the other replica serves on, and the killed one restarts on its own."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from tests.engine_helpers import long_request, make_engine, run_request, wait_until_idle
from tests.fault_helpers import engine_core_pid
from tests.realtime_helpers import serving
from tests.test_engine_behaviour import request, same_output
from tests.test_stage_replicas import spy_on_replicas
from vllm_omni.engine import Message, OmniRequest
from vllm_omni.models.qwen3_omni.checkpoint import load_checkpoint

RESTART_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def replicated(tiny_checkpoint):
    with pytest.MonkeyPatch.context() as patch:
        # 1 GiB of KV cache per engine (restarted ones too): these three run beside the session's
        # two, and the configs' share of memory per engine would not leave room for five
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        engine = make_engine(load_checkpoint(tiny_checkpoint, bridge_only=True), thinker_backend="vllm",
                             talker_backend="vllm", restart_on_failure=True, replicas={"thinker": 2})
        yield engine
        engine.shutdown()


async def hold_a_thinker(engine) -> asyncio.Task:
    """A long request, returned once it holds a thinker replica and speaks."""
    busy = asyncio.create_task(run_request(engine, long_request(thinker=60)))
    while sum(engine.workers["code2wav"].pinned_counts()) == 0:
        assert not busy.done()
        await asyncio.sleep(0.005)
    return busy


def test_two_thinker_engines_share_requests_and_give_the_reference_outputs(replicated, reference_engine) -> None:
    prompts = [dict(text="Hello there."), dict(audio="speech_en_single.wav")]
    expected = [asyncio.run(run_request(reference_engine, request(**p))) for p in prompts]
    seen = spy_on_replicas(replicated)

    async def together():
        return await asyncio.gather(*(run_request(replicated, request(**p)) for p in prompts))

    for alone, replicated_run in zip(expected, asyncio.run(together()), strict=True):
        assert same_output(alone, replicated_run)
    assert [len(ids) for ids in seen["thinker"]] == [1, 1]


def test_a_sessions_next_turn_returns_to_the_replica_that_caches_it(replicated) -> None:
    first_turn = [Message("system", text="You are a helpful voice assistant."),
                  Message("user", text="Tell me about the weather in the mountains today.")]

    async def turns():
        busy = await hold_a_thinker(replicated)  # on replica 0: the session starts on replica 1
        first = await run_request(replicated, OmniRequest(first_turn, affinity_key="session-a"))
        await busy
        final = first["final"]
        second_turn = [*first_turn, Message("assistant", text=final.text, token_ids=final.token_ids),
                       Message("user", text="And tomorrow?")]
        second = await run_request(replicated, OmniRequest(second_turn, affinity_key="session-a"))
        elsewhere = await run_request(replicated, OmniRequest(second_turn))  # the least loaded: replica 0
        return first, second, elsewhere

    seen = spy_on_replicas(replicated)
    first, second, elsewhere = asyncio.run(turns())
    session_ids = {first["final"].request_id, second["final"].request_id}
    assert session_ids <= seen["thinker"][1] and elsewhere["final"].request_id in seen["thinker"][0]
    block = replicated.workers["thinker"].replicas[1].driver.engine.vllm_config.cache_config.block_size
    cached, uncached = second["final"].usage.cached_tokens, elsewhere["final"].usage.cached_tokens
    # the first turn's prompt and answer fill a block of the session's replica; the other has none of it
    assert cached >= block > uncached, (cached, uncached, block)


def test_a_killed_replica_fails_only_its_request_and_comes_back(replicated) -> None:
    async def scenario() -> None:
        spared = await hold_a_thinker(replicated)  # replica 0
        doomed_outputs: list = []

        async def doomed() -> None:
            async for output in replicated.generate(long_request(thinker=200)):
                doomed_outputs.append((time.monotonic(), output))

        doomed_task = asyncio.create_task(doomed())
        while replicated.workers["thinker"].pinned_counts() != [1, 1] or not doomed_outputs:
            await asyncio.sleep(0.005)
        os.kill(engine_core_pid(replicated, "thinker", replica=1), signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.wait_for(doomed_task, 10)
        at, final = doomed_outputs[-1]
        assert final.finish_reason == "error" and final.error_code == "stage_unavailable"
        assert "thinker (stage_id 0) replica 1 died" in final.error and at - killed < 2.0
        survivor = await asyncio.wait_for(spared, 60)
        assert survivor["final"].finish_reason in ("stop", "length") and len(survivor["pcm"]) > 0
        meanwhile = await run_request(replicated, request("Still there?"))  # replica 0 serves while 1 restarts
        assert meanwhile["final"].finish_reason in ("stop", "length")
        await wait_until_idle(replicated, 5.0)

    with serving(replicated, borrowed=True) as (url, engine, _):
        asyncio.run(scenario())
        health = httpx.get(url.replace("ws://", "http://") + "/health")
        if replicated.workers["thinker"].dead():  # still restarting
            assert health.status_code == 200 and health.json()["dead_replicas"] == ["thinker[1]"]
        began = time.monotonic()
        while replicated.workers["thinker"].dead():
            assert time.monotonic() - began < RESTART_TIMEOUT_S, "the killed replica did not come back"
            time.sleep(0.5)
        assert httpx.get(url.replace("ws://", "http://") + "/health").json()["status"] == "ok"

    async def both_again():
        busy = await hold_a_thinker(replicated)
        after = await run_request(replicated, request("Back again?"))  # on the restarted replica 1
        await busy
        return after

    seen = spy_on_replicas(replicated)
    after = asyncio.run(both_again())
    assert after["final"].finish_reason in ("stop", "length") and after["final"].request_id in seen["thinker"][1]
