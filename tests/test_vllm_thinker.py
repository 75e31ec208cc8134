"""The thinker on a real vLLM CPU engine: same tokens, same talker codes, same audio as transformers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.engine_helpers import make_engine, run_request
from tests.test_pipeline_parity import CASES, engine_request, reference  # noqa: F401  (fixture)
from vllm_omni.engine import Message, OmniRequest, RequestError
from vllm_omni.models.qwen3_omni.vllm_thinker import collapse_audio_placeholders


@pytest.fixture(scope="module")
def vllm_engines(tiny_loaded):
    """One vLLM thinker engine per async_chunk setting (each start takes about a minute)."""
    engine = make_engine(tiny_loaded, async_chunk=True, thinker_backend="vllm")
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("case", list(CASES))
def test_vllm_thinker_equals_transformers(case: str, reference, vllm_engines) -> None:  # noqa: F811
    expected = reference(case)
    ours = asyncio.run(run_request(vllm_engines, engine_request(case)))
    assert ours["final"].error is None
    assert list(ours["final"].token_ids) == expected["tokens"]
    assert np.array_equal(ours["codes"], expected["codes"])
    assert ours["pcm"].shape == expected["one_shot_pcm"].shape
    assert np.abs(ours["pcm"] - expected["one_shot_pcm"]).max() <= 1


def test_concurrent_requests_and_abort_on_vllm(vllm_engines) -> None:
    async def scenario():
        requests = [engine_request(case) for case in CASES]
        solo = await run_request(vllm_engines, engine_request("text"))
        victim = OmniRequest([Message("user", text="A long story please.")],
                             sampling={"thinker": {"max_tokens": 200}, "talker": {"max_tokens": 200}})
        stream = vllm_engines.generate(victim)
        await stream.__anext__()
        assert await vllm_engines.abort(victim.request_id)
        together = await asyncio.gather(*(run_request(vllm_engines, r) for r in requests))
        assert together[0]["final"].token_ids == solo["final"].token_ids
        errors = [r["final"].error for r in together]
        assert all(r["final"].finish_reason in ("stop", "length") for r in together), errors
        await stream.aclose()
        for _ in range(100):
            if vllm_engines.num_active_requests() == 0:
                break
            await asyncio.sleep(0.05)
        assert vllm_engines.num_active_requests() == 0

    asyncio.run(scenario())


def test_bad_input_on_vllm_fails_only_that_request(vllm_engines) -> None:
    async def scenario():
        with pytest.raises(RequestError, match="max_tokens"):
            async for _ in vllm_engines.generate(OmniRequest([Message("user", text="hi")],
                                                             sampling={"thinker": {"max_tokens": 0}})):
                pass
        good = await run_request(vllm_engines, engine_request("text"))
        assert good["final"].finish_reason in ("stop", "length")

    asyncio.run(scenario())


def test_placeholders_collapse_per_audio_item() -> None:
    pad = 7
    assert collapse_audio_placeholders([1, pad, pad, pad, 2, pad, pad, 3], pad) == [1, pad, 2, pad, 3]


@pytest.fixture(scope="module")
def vllm_server(tiny_loaded):
    from tests.realtime_helpers import running_server

    overrides = {"stages.0.backend": "vllm", "stages.1.default_sampling_params.max_tokens": 48}
    with running_server(tiny_loaded, overrides) as (url, _, _):
        yield url


def test_server_vad_two_turns_with_the_vllm_thinker(vllm_server) -> None:
    from tests.realtime_helpers import append_events, connect, fixture_pcm
    from tests.test_realtime_ga_lane import SERVER_VAD_UPDATE, check_s2_turn

    async def scenario():
        client = await connect(vllm_server)
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


def test_legacy_smoke_with_the_vllm_thinker(vllm_server) -> None:
    from tests.test_realtime_legacy_lane import check_legacy_output, legacy_turn

    client, result = asyncio.run(legacy_turn(vllm_server, delay=0.02))
    check_legacy_output(client, result)


def test_a_dead_engine_fails_its_requests_instead_of_hanging(tiny_loaded) -> None:
    import os
    import signal

    import psutil

    engine = make_engine(tiny_loaded, thinker_backend="vllm")
    try:
        async def scenario():
            long = OmniRequest([Message("user", text="Tell me everything.")],
                               sampling={"thinker": {"max_tokens": 1000}, "talker": {"max_tokens": 1000}})
            stream = engine.generate(long)
            await stream.__anext__()
            children = psutil.Process().children(recursive=True)
            cores = [p for p in children if "EngineCore" in " ".join(p.cmdline()) + p.name()]
            assert cores, [p.name() for p in children]
            for core in cores:
                os.kill(core.pid, signal.SIGKILL)
            outputs = [output async for output in stream]
            assert outputs[-1].finish_reason == "error" and "thinker" in outputs[-1].error
            assert engine.unhealthy_stages() == ["thinker"]
            after = await asyncio.wait_for(run_request(engine, engine_request("text")), 60)
            assert after["final"].finish_reason == "error"

        asyncio.run(asyncio.wait_for(scenario(), 180))
    finally:
        engine.shutdown()
