"""Playback-deadline scheduling on the served stages (thinker and talker on vLLM, code2wav
on torch; `vllm_engine` in conftest.py): an answer far ahead of its listener yields to a new
turn until that turn's first audio is out, and nobody's output changes for it."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from tests.engine_helpers import run_request
from vllm_omni.engine import AudioChunk, Message, OmniRequest, RequestFinished

LONG = {"thinker": {"max_tokens": 8}, "talker": {"max_tokens": 300, "ignore_eos": True}}  # 24 s of audio
SHORT = {"thinker": {"max_tokens": 8}, "talker": {"max_tokens": 20}}
AHEAD_S = 5.0  # the long answer's lead when the new turn comes (pacing yields above 2.5 s)


def request(request_id: str, text: str, sampling: dict) -> OmniRequest:
    return OmniRequest([Message("user", text=text)], sampling=sampling, request_id=request_id)


async def long_answer_then_new_turn(engine) -> dict:
    """The long answer streams until it is AHEAD_S ahead of real-time playback; then the new
    turn comes. Returns both outputs and the receive times of the long answer's chunks."""
    long_chunks: list[tuple[float, AudioChunk]] = []
    started: dict[str, float] = {}
    new_turn: asyncio.Task | None = None

    async def new_turn_run() -> dict:
        started["new"] = time.monotonic()
        outcome = await run_request(engine, request("pacing-new", "What time is it?", SHORT))
        started["new_first_audio"] = started["new"] + outcome["final"].time_to_first_audio_s
        return outcome

    async for output in engine.generate(request("pacing-long", "Tell me a long story.", LONG)):
        if isinstance(output, AudioChunk):
            now = time.monotonic()
            long_chunks.append((now, output))
            lead = output.end_s - (now - long_chunks[0][0])
            if new_turn is None and lead > AHEAD_S:
                new_turn = asyncio.create_task(new_turn_run())
        elif isinstance(output, RequestFinished):
            long_final = output
    assert new_turn is not None, "the long answer never got far enough ahead"
    new = await new_turn
    pcm = np.frombuffer(b"".join(c.pcm16 for _, c in long_chunks), dtype="<i2").astype(np.int32)
    return {"long_pcm": pcm, "long_final": long_final, "long_times": [t for t, _ in long_chunks],
            "new": new, "window": (started["new"], started["new_first_audio"])}


def test_an_answer_far_ahead_yields_to_a_new_turn_and_outputs_do_not_change(vllm_engine) -> None:
    alone_long = asyncio.run(run_request(vllm_engine, request("pacing-long", "Tell me a long story.", LONG)))
    alone_new = asyncio.run(run_request(vllm_engine, request("pacing-new", "What time is it?", SHORT)))
    paced = asyncio.run(long_answer_then_new_turn(vllm_engine))

    start, first_audio = paced["window"]
    during = [t for t in paced["long_times"] if start < t < first_audio]
    # At most the chunk already being decoded when the new turn came; the rest waited.
    assert len(during) <= 1, f"the answer ahead kept streaming {len(during)} chunks while the new turn waited"
    assert paced["long_times"][-1] > first_audio  # it went on afterwards
    assert paced["long_final"].finish_reason == "length" and paced["new"]["final"].finish_reason in ("stop", "length")
    assert np.array_equal(paced["long_pcm"], alone_long["pcm"])
    assert paced["new"]["text"] == alone_new["text"]
    assert np.array_equal(paced["new"]["pcm"], alone_new["pcm"])
