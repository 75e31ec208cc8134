"""Units of the vLLM-stage plumbing: the text feed, request-id mapping, the scheduler's
text gate (over a stand-in scheduler), device pinning, tensors in RPC replies. The whole
path runs on real engines in test_vllm_backend.py."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from vllm_omni.config import PlaybackPacing, StageConfig
from vllm_omni.engine.backends.vllm.engine_driver import cpu_bind_mask, engine_kwargs, visible_device_ids
from vllm_omni.engine.backends.vllm.holding_scheduler import (
    NICE_KEY,
    PACE,
    PacedExecutor,
    PacedInProcessExecutor,
    external_request_id,
    paced_engine_kwargs,
)
from vllm_omni.engine.backends.vllm.tensor_wire import tensor_from_wire, tensor_to_wire
from vllm_omni.engine.pacing import PaceSnapshot
from vllm_omni.models.qwen3_omni.vllm_backend.talker_feed import TEXT_FEED, TextFeed
from vllm_omni.models.qwen3_omni.vllm_backend.talker_gate import (
    TalkerExecutor,
    TalkerInProcessExecutor,
    _TextGateMixin,
)

EOS, PAD = 90, 91


def test_text_feed_gives_tokens_then_eos_then_pad() -> None:
    feed = TextFeed()
    assert feed.token_for_step("r", 0, EOS, PAD) is None  # nothing pushed yet
    feed.push("r", [5, 6], finished=False)
    assert [feed.token_for_step("r", step, EOS, PAD) for step in range(3)] == [5, 6, None]
    feed.push("r", [7], finished=True)
    assert [feed.token_for_step("r", step, EOS, PAD) for step in range(6)] == [5, 6, 7, EOS, PAD, PAD]
    feed.forget("r")
    assert not feed.ready("r", 0)


def test_internal_ids_map_back_to_the_orchestrators_ids() -> None:
    assert external_request_id("req-0a1b2c3d4e5f6071-1f2e3d4c") == "req-0a1b2c3d4e5f6071"
    assert external_request_id("plain") == "plain"


@dataclass
class FakeRequest:
    request_id: str
    num_prompt_tokens: int
    num_computed_tokens: int


@dataclass
class FakeOutput:
    total_num_scheduled_tokens: int


class FakeScheduler:
    """Stands in for vLLM's scheduler: schedules everything in `running`, one token each."""

    def __init__(self, running: list[FakeRequest]):
        self.running = running
        self.max_num_running_reqs = self.max_num_active_reqs = 8
        self.waiting: list[FakeRequest] = []
        self.seen: list[list[str]] = []
        self.limits: list[tuple[int, int]] = []

    def schedule(self) -> FakeOutput:
        self.seen.append([r.request_id for r in self.running])
        self.limits.append((self.max_num_running_reqs, self.max_num_active_reqs))
        return FakeOutput(len(self.running))


class GatedFake(_TextGateMixin, FakeScheduler):
    pass


def test_gate_holds_requests_whose_text_row_is_missing() -> None:
    prefilling = FakeRequest("pre-00000001", num_prompt_tokens=10, num_computed_tokens=0)
    waiting = FakeRequest("wait-00000002", num_prompt_tokens=10, num_computed_tokens=11)  # needs step 1
    ready = FakeRequest("ready-00000003", num_prompt_tokens=10, num_computed_tokens=10)  # needs step 0
    TEXT_FEED.push("wait", [1], finished=False)
    TEXT_FEED.push("ready", [1], finished=False)
    try:
        scheduler = GatedFake([prefilling, waiting, ready])
        assert scheduler.schedule().total_num_scheduled_tokens == 2
        assert scheduler.seen[-1] == ["pre-00000001", "ready-00000003"]
        assert scheduler.limits[-1] == (7, 7)  # the held request keeps its seat: nobody is admitted to it
        assert [r.request_id for r in scheduler.running] == ["wait-00000002", "pre-00000001", "ready-00000003"]
        assert (scheduler.max_num_running_reqs, scheduler.max_num_active_reqs) == (8, 8)
        TEXT_FEED.push("wait", [2], finished=False)
        scheduler.schedule()
        assert len(scheduler.seen[-1]) == 3
    finally:
        TEXT_FEED.forget("wait")
        TEXT_FEED.forget("ready")


def test_playback_pacing_holds_the_answer_far_ahead_while_a_listener_waits() -> None:
    now = time.monotonic()
    ahead = FakeRequest("ahead-00000001", num_prompt_tokens=10, num_computed_tokens=10)
    new = FakeRequest("new-00000002", num_prompt_tokens=10, num_computed_tokens=0)
    TEXT_FEED.push("ahead", [1], finished=False)
    PACE.snapshot = PaceSnapshot(PlaybackPacing(), {"ahead": (now, 30.0), "new": (None, 0.0)})
    try:
        scheduler = GatedFake([ahead, new])
        scheduler.schedule()
        assert scheduler.seen[-1] == ["new-00000002"]
        PACE.snapshot = PaceSnapshot(PlaybackPacing(), {"ahead": (now, 30.0), "new": (now, 3.0)})  # heard
        scheduler.schedule()
        assert scheduler.seen[-1] == ["ahead-00000001", "new-00000002"]
        PACE.snapshot = PaceSnapshot(PlaybackPacing(), {"ahead": (now, 30.0), "new": (now, 3.0), "late": (None, 0.0)})
        scheduler.max_num_running_reqs = scheduler.max_num_active_reqs = 2
        scheduler.waiting = [FakeRequest("late-00000003", num_prompt_tokens=10, num_computed_tokens=0)]
        scheduler.schedule()  # a waiting turn needs a seat: nobody keeps one by yielding
        assert scheduler.seen[-1] == ["ahead-00000001", "new-00000002"]
    finally:
        PACE.snapshot = None
        TEXT_FEED.forget("ahead")


def test_cpu_cores_become_vllm_thread_binding_per_rank() -> None:
    assert cpu_bind_mask([1], 1) == "1"
    assert cpu_bind_mask([0, 1, 2, 3], 2) == "0,1|2,3"
    with pytest.raises(ValueError, match="needs as many cores"):
        cpu_bind_mask([0], 2)


def test_one_device_runs_the_model_in_the_engine_process_several_in_workers() -> None:
    """vLLM's CPU platform would start a worker process even for one device; the executor
    chosen here runs the model in the EngineCore process then, as vLLM does on one GPU."""
    assert paced_engine_kwargs({"tensor_parallel_size": 1}, cpu=True)["distributed_executor_backend"] \
        is PacedInProcessExecutor
    assert paced_engine_kwargs({"tensor_parallel_size": 2}, cpu=True)["distributed_executor_backend"] \
        is PacedExecutor
    talker = (TalkerExecutor, TalkerInProcessExecutor)
    assert paced_engine_kwargs({}, cpu=False, executors=talker)["distributed_executor_backend"] \
        is TalkerInProcessExecutor


def test_a_stages_nice_joins_the_engines_additional_config() -> None:
    stage = StageConfig(stage_id=1, role="talker", backend="vllm", nice=7)
    kwargs = engine_kwargs(stage, "model", additional_config={"omni_frame_address": "ipc://frames"})
    assert kwargs["additional_config"] == {"omni_frame_address": "ipc://frames", NICE_KEY: 7}
    assert "additional_config" not in engine_kwargs(stage.model_copy(update={"nice": 0}), "model")


def test_stage_devices_are_numbered_as_this_process_sees_them() -> None:
    assert visible_device_ids([1], None) == "1"
    assert visible_device_ids([0, 1], "4,5,6") == "4,5"
    with pytest.raises(ValueError, match="not visible"):
        visible_device_ids([3], "4,5")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensors_cross_rpc_replies_as_bytes(dtype: torch.dtype) -> None:
    tensor = torch.randn(5, 2, 7).to(dtype)[:, :, 1:]  # a non-contiguous view
    wire = tensor_to_wire(tensor)
    assert isinstance(wire["data"], bytes)
    assert torch.equal(tensor_from_wire(wire), tensor)


class StandInFeed:
    """Answers `omni_push_texts` after a short delay; records each call's pushes."""

    def __init__(self):
        self.calls: list[list[list]] = []

    async def collective_rpc(self, method: str, args: tuple) -> list[None]:
        import asyncio

        assert method == "omni_push_texts"
        self.calls.append(args[0])
        await asyncio.sleep(0.05)
        return [None]


def test_text_pump_sends_every_waiting_request_in_one_call_and_settles_before_a_forget() -> None:
    import asyncio

    from vllm_omni.models.qwen3_omni.vllm_backend.rpc_pumps import TextPump

    async def scenario():
        engine = StandInFeed()
        pump = TextPump(engine)
        first = asyncio.create_task(pump.push("a", [1, 2], False))
        await asyncio.sleep(0.01)  # a's push is in flight; b and c wait for the next call together
        later = asyncio.gather(pump.push("b", [3], False), pump.push("c", [4], True))
        await asyncio.sleep(0.01)
        await pump.settle("c")  # c's push had not left yet: dropped
        await asyncio.wait_for(first, 1)
        await asyncio.sleep(0.1)
        assert engine.calls == [[["a", [1, 2], False]], [["b", [3], False]]]
        later.cancel()

    asyncio.run(scenario())


def test_frames_cross_the_channel_in_order_for_open_requests_only() -> None:
    import asyncio
    import os

    from vllm_omni.models.qwen3_omni.vllm_backend.frame_channel import FrameReceiver, FrameSender, new_frame_address

    async def scenario():
        receiver = FrameReceiver(new_frame_address())
        receiver.start()
        try:
            queue = receiver.open("a")
            sender = FrameSender(receiver.address)
            sender.send({"a": [[1] * 16, [2] * 16], "gone": [[9] * 16]})
            sender.send({})  # nothing to send: no message
            sender.send({"a": [[3] * 16]})
            got = [await asyncio.wait_for(queue.get(), 5) for _ in range(3)]
            assert got == [[1] * 16, [2] * 16, [3] * 16]
            assert receiver.open("gone").empty()  # frames of a request not open then were dropped
            receiver.close_request("a")
            sender.send({"a": [[4] * 16]})
            await asyncio.sleep(0.1)
            assert queue.empty()
        finally:
            receiver.close()
        assert not os.path.exists(receiver.address.removeprefix("ipc://"))

    asyncio.run(scenario())
