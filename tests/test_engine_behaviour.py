"""The engine under load and abuse: concurrency, abort, bad input, streaming input."""

from __future__ import annotations

import asyncio
import re
import time

import numpy as np
import pytest
import torch

from tests.conftest import read_fixture_pcm
from tests.engine_helpers import RecordingFamily, make_engine, run_request
from vllm_omni.config import get_deploy_config_path, load_deploy_config
from vllm_omni.engine import AudioChunk, Message, OmniEngine, OmniRequest, RequestError, RequestFinished


def request(text: str | None = None, audio: str | None = None, thinker: int = 12, talker: int = 40,
            **fields) -> OmniRequest:
    message = Message("user", text=text, audio=read_fixture_pcm(audio) if audio else None)
    return OmniRequest([message], sampling={"thinker": {"max_tokens": thinker},
                                            "talker": {"max_tokens": talker}}, **fields)


def same_output(a: dict, b: dict) -> bool:
    return (a["final"].token_ids == b["final"].token_ids and np.array_equal(a["codes"], b["codes"])
            and a["pcm"].shape == b["pcm"].shape and np.abs(a["pcm"] - b["pcm"]).max(initial=0) <= 1)


@pytest.fixture(scope="module")
def engine(tiny_loaded):
    built = make_engine(tiny_loaded, async_chunk=True, first=4, later=25)
    yield built
    built.shutdown()


PROMPTS = [dict(text="Hello there."), dict(audio="speech_en_single.wav"), dict(text="What time is it?"),
           dict(audio="speech_with_pause.wav"), dict(text="Sing me a song."), dict(audio="noise_only.wav"),
           dict(text="Tell me a fun fact about the ocean."), dict(audio="speech_en_two_turns.wav")]


def test_eight_concurrent_requests_equal_their_solo_runs(engine) -> None:
    solo = [asyncio.run(run_request(engine, request(**p))) for p in PROMPTS]

    async def together():
        return await asyncio.gather(*(run_request(engine, request(**p)) for p in PROMPTS))

    for alone, concurrent in zip(solo, asyncio.run(together()), strict=True):
        assert concurrent["final"].finish_reason in ("stop", "length")
        assert same_output(alone, concurrent)
    assert engine.num_active_requests() == 0


def test_server_torch_threads_hold_for_the_engines_life(tiny_loaded) -> None:
    outer = torch.get_num_threads()
    chosen = 2 if outer == 1 else 1
    deploy = load_deploy_config(get_deploy_config_path("qwen3_omni_tiny_cpu_torch"), platform="cpu")
    engine = OmniEngine(RecordingFamily(tiny_loaded, deploy.model_copy(update={"server_torch_threads": chosen})))
    try:
        assert torch.get_num_threads() == chosen
        result = asyncio.run(run_request(engine, request(text="Hello there.", thinker=4, talker=8)))
        assert result["final"].finish_reason in ("stop", "length") and result["pcm"].size > 0
    finally:
        engine.shutdown()
    assert torch.get_num_threads() == outer


def test_more_requests_than_max_num_seqs_wait_their_turn(tiny_loaded) -> None:
    narrow = make_engine(tiny_loaded, max_num_seqs=2)
    try:
        async def together():
            return await asyncio.gather(*(run_request(narrow, request(**p, thinker=6, talker=10))
                                          for p in PROMPTS[:5]))

        results = asyncio.run(together())
        assert all(r["final"].finish_reason in ("stop", "length") for r in results)
    finally:
        narrow.shutdown()


def test_abort_after_first_audio_chunk(engine) -> None:
    async def scenario():
        bystander_solo = await run_request(engine, request(text="Keep talking.", talker=80))
        bystander = asyncio.create_task(run_request(engine, request(text="Keep talking.", talker=80)))
        victim = request(audio="speech_en_single.wav", thinker=40, talker=200)
        outputs = []
        aborted_at = None
        async for output in engine.generate(victim):
            outputs.append(output)
            if isinstance(output, AudioChunk) and aborted_at is None:
                assert await engine.abort(victim.request_id)
                aborted_at = len(outputs)
        # Nothing but the final record after the abort.
        assert len(outputs) == aborted_at + 1
        assert isinstance(outputs[-1], RequestFinished) and outputs[-1].finish_reason == "abort"
        assert not await engine.abort(victim.request_id)  # already gone
        other = await bystander
        assert same_output(bystander_solo, other)
        deadline = time.monotonic() + 1.0
        while engine.num_active_requests() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert engine.num_active_requests() == 0
        after = await run_request(engine, request(text="Are you still there?"))
        assert after["final"].finish_reason in ("stop", "length") and len(after["pcm"]) > 0

    asyncio.run(scenario())


def test_consumer_that_stops_listening_frees_the_request(engine) -> None:
    async def scenario():
        stream = engine.generate(request(text="A long story, please.", thinker=40, talker=200))
        async for output in stream:
            if isinstance(output, AudioChunk):
                break
        await stream.aclose()
        deadline = time.monotonic() + 1.0
        while engine.num_active_requests() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert engine.num_active_requests() == 0

    asyncio.run(scenario())


BAD_REQUESTS = {
    "empty audio": (OmniRequest([Message("user", audio=np.zeros(0, np.float32))]), "messages[0].audio: is empty"),
    "wrong rate": (OmniRequest([Message("user", audio=np.zeros(8000, np.float32), sample_rate=8000)]),
                   "sample rate must be 16000 Hz, got 8000"),
    "int16 samples": (OmniRequest([Message("user", audio=np.zeros(16000, np.int16))]), "dtype int16"),
    "unknown speaker": (OmniRequest([Message("user", text="hi")], speaker="zorro"), "unknown speaker 'zorro'"),
    "max_tokens 0": (OmniRequest([Message("user", text="hi")], sampling={"thinker": {"max_tokens": 0}}),
                     "sampling.thinker.max_tokens"),
    "prompt too long": (OmniRequest([Message("user", text="word " * 1000)]), "the model's context is 4096"),
    "no user turn": (OmniRequest([Message("assistant", text="hi")]), "the last turn must be the user's"),
    "empty turn": (OmniRequest([Message("user")]), "has neither text nor audio"),
    "unknown modality": (OmniRequest([Message("user", text="hi")], modalities=("video",)), "modalities"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_fails_only_that_request(engine, case: str) -> None:
    bad, message = BAD_REQUESTS[case]

    async def scenario():
        with pytest.raises(RequestError, match=re.escape(message)):
            async for _ in engine.generate(bad):
                pass
        good = await run_request(engine, request(text="Still here?", thinker=4, talker=8))
        assert good["final"].finish_reason in ("stop", "length")

    asyncio.run(scenario())


def test_streamed_audio_input_equals_whole_clip(engine) -> None:
    clip = read_fixture_pcm("speech_en_single.wav")
    stream = engine.create_audio_stream()
    for start in range(0, len(clip), 1600):  # 100 ms at a time, as a microphone would
        stream.append(clip[start:start + 1600])
    streamed = OmniRequest([Message("user", audio_stream=stream)],
                           sampling={"thinker": {"max_tokens": 12}, "talker": {"max_tokens": 40}})
    whole = asyncio.run(run_request(engine, request(audio="speech_en_single.wav")))
    assert same_output(asyncio.run(run_request(engine, streamed)), whole)


def test_text_only_request_has_no_audio(engine) -> None:
    result = asyncio.run(run_request(engine, request(text="Just text.", modalities=("text",))))
    assert result["final"].finish_reason in ("stop", "length")
    assert result["text"] == result["final"].text and len(result["pcm"]) == 0


def test_final_record_carries_stage_metrics(engine) -> None:
    final = asyncio.run(run_request(engine, request(text="Metrics please.")))["final"]
    thinker, talker = final.stage_metrics["thinker"], final.stage_metrics["talker"]
    assert thinker.outputs == len(final.token_ids) and thinker.first_output_s > 0
    assert len(thinker.intervals_s) == thinker.outputs - 1 and thinker.mean_interval_s > 0
    assert talker.outputs > 0 and final.time_to_first_audio_s >= thinker.first_output_s
    assert final.audio_duration_s == pytest.approx((talker.outputs * 1920 - 555) / 24000)


def test_talker_ending_before_the_thinker_frees_its_slot(tiny_loaded) -> None:
    """Text keeps arriving for a talker request that already ended; it must not hold a slot."""
    single = make_engine(tiny_loaded, max_num_seqs=1)
    try:
        async def three():
            return await asyncio.gather(*(run_request(single, request(text=f"Question {i}", thinker=30, talker=3))
                                          for i in range(3)))

        results = asyncio.run(asyncio.wait_for(three(), 120))
        assert all(r["final"].finish_reason in ("stop", "length") and len(r["pcm"]) > 0 for r in results)
    finally:
        single.shutdown()


def test_thinker_stops_at_a_requested_stop_token(engine) -> None:
    """`stop_token_ids` ends the text answer on the torch backend as on vLLM: the stop token is
    the last one and the finish reason is "stop"."""
    full = asyncio.run(run_request(engine, request(text="Stop early.", modalities=("text",))))["final"]
    assert len(full.token_ids) >= 3
    stop = full.token_ids[2]
    cut = OmniRequest([Message("user", text="Stop early.")], modalities=("text",),
                      sampling={"thinker": {"max_tokens": 12, "stop_token_ids": [stop]}})
    final = asyncio.run(run_request(engine, cut))["final"]
    assert final.token_ids == full.token_ids[: full.token_ids.index(stop) + 1]
    assert final.finish_reason == "stop"
