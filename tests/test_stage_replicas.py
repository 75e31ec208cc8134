"""Stage replicas (`replicas: N`): how a config splits devices among them, how requests are
routed (least loaded, pinned, a session's turns together), and the real tiny pipeline with
two replicas of every stage: the same tokens and PCM as one replica, both replicas at work,
and one replica dying without taking the stage down."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.config_helpers import stage
from tests.engine_helpers import long_request, make_engine, run_request, wait_until_idle
from tests.realtime_helpers import serving
from tests.test_engine_behaviour import PROMPTS, request, same_output
from vllm_omni.config import StageConfig
from vllm_omni.engine import AudioChunk
from vllm_omni.engine.replicas import StageReplicas

REPLICAS = {"thinker": 2, "talker": 2, "code2wav": 2}

# The config -------------------------------------------------------------------------------


def test_replicas_take_equal_groups_of_the_stages_devices_and_cores() -> None:
    config = StageConfig.model_validate(stage(0, replicas=2, devices=[0, 1, 2, 3], cpu_cores=[4, 5]))
    assert [(s.replicas, s.devices, s.cpu_cores) for s in config.replica_stages()] == \
        [(1, [0, 1], [4]), (1, [2, 3], [5])]


def test_replicas_without_devices_share_the_default_ones() -> None:
    config = StageConfig.model_validate(stage(0, replicas=3))
    assert [(s.devices, s.cpu_cores) for s in config.replica_stages()] == [([0], None)] * 3


def test_devices_that_do_not_split_evenly_are_refused() -> None:
    with pytest.raises(ValueError, match=r"devices: 2 replicas take equal groups of devices, got 3"):
        StageConfig.model_validate(stage(0, replicas=2, devices=[0, 1, 2]))


# Routing, with stand-in replicas -----------------------------------------------------------


class CountingReplica:
    """Records what it is handed; its health is set by the test."""

    max_active = 4

    def __init__(self) -> None:
        self.messages: list[tuple[str, object]] = []
        self.dropped: list[str] = []
        self.alive = True

    def submit(self, request_id: str, message: object) -> None:
        self.messages.append((request_id, message))

    def drop(self, request_id: str) -> None:
        self.dropped.append(request_id)

    def healthy(self) -> bool:
        return self.alive


def routed(count: int = 2) -> tuple[StageReplicas, list[CountingReplica]]:
    replicas = [CountingReplica() for _ in range(count)]
    return StageReplicas("thinker", replicas), replicas


def test_a_new_request_goes_to_the_least_loaded_replica_and_stays_there() -> None:
    stage_replicas, (first, second) = routed()
    stage_replicas.submit("a", "start a")
    stage_replicas.submit("b", "start b")
    stage_replicas.submit("a", "more a")
    stage_replicas.submit("c", "start c")
    assert first.messages == [("a", "start a"), ("a", "more a"), ("c", "start c")]
    assert second.messages == [("b", "start b")]
    stage_replicas.drop("a")
    stage_replicas.drop("c")
    stage_replicas.drop("never-came")  # a request that never reached this stage: no replica hears of it
    assert (first.dropped, second.dropped) == (["a", "c"], [])
    stage_replicas.submit("d", "start d")  # the first replica holds nothing now
    assert first.messages[-1] == ("d", "start d")


def test_a_request_done_at_the_stage_no_longer_loads_its_replica() -> None:
    stage_replicas, (first, second) = routed()
    stage_replicas.submit("a", "start a")  # first
    stage_replicas.submit("b", "start b")  # second
    stage_replicas.submit("c", "start c")  # first (a tie)
    stage_replicas.done("a")
    stage_replicas.done("c")  # the thinker is through with a and c; later stages still speak them
    stage_replicas.submit("d", "start d")
    assert first.messages[-1] == ("d", "start d")  # by pins alone, the second would have it
    assert stage_replicas.pinned_to(0) == ["a", "c", "d"]  # still pinned: their drop goes there
    stage_replicas.drop("a")
    assert first.dropped == ["a"]


def test_a_sessions_turns_return_to_its_replica_while_it_is_healthy() -> None:
    stage_replicas, (first, second) = routed()
    stage_replicas.submit("s1-turn1", "x", affinity="s1")
    stage_replicas.submit("s2-turn1", "x", affinity="s2")
    stage_replicas.drop("s1-turn1")
    stage_replicas.submit("other", "x")  # to the first replica, now the least loaded
    stage_replicas.submit("s1-turn2", "x", affinity="s1")  # back to the first despite its load
    assert [rid for rid, _ in first.messages] == ["s1-turn1", "other", "s1-turn2"]
    first.alive = False
    stage_replicas.submit("s1-turn3", "x", affinity="s1")
    assert second.messages[-1][0] == "s1-turn3"
    assert stage_replicas.pinned_to(0) == ["other", "s1-turn2"] and stage_replicas.dead() == [0]
    assert stage_replicas.healthy()


# The tiny pipeline with two replicas of every stage ------------------------------------------


def spy_on_replicas(engine) -> dict[str, list[set[str]]]:
    """Per role, the request ids each replica was handed (the real replicas, wrapped)."""
    seen = {role: [set() for _ in replicas.replicas] for role, replicas in engine.workers.items()}
    for role, replicas in engine.workers.items():
        for index, replica in enumerate(replicas.replicas):
            def submit(request_id, message, _real=replica.submit, _seen=seen[role][index]):
                _seen.add(request_id)
                _real(request_id, message)
            replica.submit = submit
    return seen


def test_two_replicas_of_every_stage_give_the_outputs_of_one(tiny_loaded, reference_engine) -> None:
    solo = [asyncio.run(run_request(reference_engine, request(**p))) for p in PROMPTS[:4]]
    engine = make_engine(tiny_loaded, replicas=REPLICAS)
    try:
        seen = spy_on_replicas(engine)

        async def together():
            return await asyncio.gather(*(run_request(engine, request(**p)) for p in PROMPTS[:4]))

        for alone, replicated in zip(solo, asyncio.run(together()), strict=True):
            assert replicated["final"].finish_reason in ("stop", "length")
            assert same_output(alone, replicated)
        for role in REPLICAS:
            assert [len(ids) for ids in seen[role]] == [2, 2], (role, seen[role])  # four requests, split evenly
        asyncio.run(wait_until_idle(engine, 1.0))
        assert [s.active_requests for s in engine.replica_stats()] == [0] * 6
    finally:
        engine.shutdown()


def test_a_sessions_turns_run_on_the_replicas_of_its_first_turn(tiny_loaded) -> None:
    engine = make_engine(tiny_loaded, replicas=REPLICAS)
    try:
        seen = spy_on_replicas(engine)

        async def turns():
            busy = asyncio.create_task(run_request(engine, long_request()))
            while sum(engine.workers["code2wav"].pinned_counts()) == 0:  # it holds a replica of every stage
                await asyncio.sleep(0.005)
            first = await run_request(engine, request("Hello there.", affinity_key="session-1"))
            await busy
            second = await run_request(engine, request("And again.", affinity_key="session-1"))
            return first, second

        first, second = asyncio.run(turns())
        ids = (first["final"].request_id, second["final"].request_id)
        for role in REPLICAS:
            assert any(set(ids) <= replica_ids for replica_ids in seen[role]), (role, seen[role])
    finally:
        engine.shutdown()


def test_a_dead_replica_fails_only_its_requests_and_the_stage_goes_on(tiny_loaded) -> None:
    async def scenario(engine):
        outputs: dict[str, list] = {}

        async def consume(index: int) -> None:
            outputs[index] = [(time.monotonic(), o) async for o in engine.generate(long_request(talker=400))]

        tasks = [asyncio.create_task(consume(i)) for i in range(2)]
        talker = engine.workers["talker"]
        while sorted(talker.pinned_counts()) != [1, 1]:  # both requests speak, one on each talker
            await asyncio.sleep(0.005)
        doomed_id = talker.pinned_to(1)[0]
        talker.replicas[1].stop()  # its worker thread ends: the replica is dead
        died = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        finals = {o[-1][1].request_id: o[-1] for o in outputs.values()}
        at, doomed = finals.pop(doomed_id)
        assert doomed.finish_reason == "error" and doomed.error_code == "stage_unavailable"
        assert "talker (stage_id 1) replica 1 died" in doomed.error and at - died < 2.0
        (_, survivor), = finals.values()
        assert survivor.finish_reason in ("stop", "length") and survivor.audio_duration_s > 0
        after = await run_request(engine, request("Still there?"))
        assert after["final"].finish_reason in ("stop", "length") and len(after["pcm"]) > 0
        assert any(isinstance(c, AudioChunk) for c in after["chunks"])
        await wait_until_idle(engine, 1.0)

    with serving(make_engine(tiny_loaded, replicas=REPLICAS)) as (url, engine, _):
        asyncio.run(scenario(engine))
        base = url.replace("ws://", "http://")
        health = httpx.get(base + "/health")
        assert health.status_code == 200, health.text
        assert health.json()["status"] == "degraded" and health.json()["dead_replicas"] == ["talker[1]"]
        assert health.json()["dead_stages"] == []
        scraped = httpx.get(base + "/metrics").text
        assert 'vllm_omni_stage_replica_up{replica="0",stage="talker"} 1.0' in scraped
        assert 'vllm_omni_stage_replica_up{replica="1",stage="talker"} 0.0' in scraped
