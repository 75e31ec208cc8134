"""Killing one vLLM stage's engine process at a chosen point of a request, and timing what
follows (shared by tests/test_vllm_backend.py and benchmarks/fault_injection.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass

from tests.engine_helpers import wait_until_idle
from vllm_omni.engine import AudioChunk, Message, OmniEngine, OmniRequest, RequestFinished, StageUnavailableError

# Where in a request the engine dies: right after it was submitted (before any output), after
# its first audio chunk, or once the thinker is done and only the talker still runs.
KILL_POINTS = ("before_output", "mid_audio", "talker_only")
# A torch stage drops a failed request after its current round, and that round competes for the
# cores with the killed engine's restart (a new EngineCore loading and warming up the model, all
# cores busy): on a loaded 2-core CI machine a round has taken over 3 s.
IDLE_AFTER_KILL_S = 10.0


def engine_core_pid(engine: OmniEngine, role: str, replica: int = 0) -> int:
    """The EngineCore process of a vLLM stage's replica (vLLM's client keeps its process handle)."""
    driver = engine.workers[role].replicas[replica].driver
    return driver.engine.engine_core.resources.engine_manager.processes[0].pid


def doomed_request(point: str) -> OmniRequest:
    """Long enough to still run when the kill comes; for `talker_only` a short answer read slowly."""
    thinker = 4 if point == "talker_only" else 200
    return OmniRequest([Message("user", text="Tell me everything.")], sampling={
        "thinker": {"max_tokens": thinker}, "talker": {"max_tokens": 600, "ignore_eos": True}})


def _reached(point: str, engine: OmniEngine, outputs: list) -> bool:
    if point == "before_output":
        return True
    audio = any(isinstance(output, AudioChunk) for _, output in outputs)
    if point == "mid_audio":
        return audio
    counts = engine.active_requests_by_stage()
    return audio and counts["thinker"] == 0 and counts["talker"] == 1


@dataclass
class KillOutcome:
    role: str
    point: str
    final: RequestFinished
    outputs_before_kill: int
    kill_to_final_s: float
    refusal_s: float  # how long `generate` took to refuse a request sent right after the final record
    refusal: StageUnavailableError


async def kill_during_request(engine: OmniEngine, role: str, point: str, timeout_s: float = 10.0) -> KillOutcome:
    """SIGKILL `role`'s EngineCore at `point` of a request; the request must end (within
    `timeout_s`), new requests must be refused, and no stage may count anything soon after
    (within IDLE_AFTER_KILL_S)."""
    outputs: list = []

    async def consume() -> None:
        async for output in engine.generate(doomed_request(point)):
            outputs.append((time.monotonic(), output))

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0)  # admitted
    while not _reached(point, engine, outputs):
        if consumer.done():
            raise AssertionError(f"request ended before {point}: {outputs[-1:]}")
        await asyncio.sleep(0.005)
    os.kill(engine_core_pid(engine, role), signal.SIGKILL)
    killed = time.monotonic()
    before = len(outputs)
    await asyncio.wait_for(consumer, timeout_s)
    at, final = outputs[-1]
    asked = time.monotonic()
    refusal = await _refusal(engine)
    refusal_s = time.monotonic() - asked
    await wait_until_idle(engine, IDLE_AFTER_KILL_S)
    return KillOutcome(role, point, final, before, at - killed, refusal_s, refusal)


async def _refusal(engine: OmniEngine) -> StageUnavailableError:
    try:
        async for _ in engine.generate(OmniRequest([Message("user", text="Hello?")])):
            break
    except StageUnavailableError as exc:
        return exc
    raise AssertionError("a request was accepted while a stage is dead")


async def wait_until_healthy(engine: OmniEngine, timeout_s: float) -> float:
    """Seconds until every stage is healthy again (a restarted engine is up)."""
    began = time.monotonic()
    while engine.unhealthy_stages():
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"stages {engine.unhealthy_stages()} still down after {timeout_s} s")
        await asyncio.sleep(0.2)
    return time.monotonic() - began
