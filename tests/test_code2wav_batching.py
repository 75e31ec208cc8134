"""code2wav batched across streams: one conv pass over several requests' chunks.

A shared pass may differ from each stream decoded alone by float rounding only: within
1 LSB of 16-bit PCM (README.md, "The pipeline"); a stream alone in its group decodes
bit-identically. The step worker hands a batch-capable program each round in one call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.engine_helpers import make_engine, run_request
from vllm_omni.audio.pcm import float_to_pcm16
from vllm_omni.config import ConfigError, get_deploy_config_path, load_deploy_config
from vllm_omni.engine import Message, OmniRequest
from vllm_omni.engine.backends.step_worker import StageWorker
from vllm_omni.engine.stage_api import AudioSamples, BatchedStageProgram, StageDone
from vllm_omni.models.qwen3_omni.messages import CodecChunk
from vllm_omni.models.qwen3_omni.torch_backend.code2wav import (
    ExactCode2WavStream,
    decode_batch,
    make_code2wav_stream,
)
from vllm_omni.models.qwen3_omni.torch_backend.programs import BatchedCode2WavProgram, Code2WavProgram

RAMP = [1, 1, 1, 1, 2, 3, 4, 6, 9]  # CodecChunker's ramp (models/qwen3_omni/family.py)
# Chunk sizes per round (0: no chunk that round): ramps in step, a ramp joining late,
# 4-then-25 chunks, and one frame every round.
SCHEDULES = [RAMP, RAMP, [0, 0, 0, *RAMP[:6]], [4, 25, 25], [4, 25, 25], [1] * 9, [0, 1, 1, 1, 1, 2]]
LATER = [3, 1, 7]  # single decodes after the batched rounds


def pcm(samples: torch.Tensor) -> np.ndarray:
    return float_to_pcm16(samples.numpy()).astype(np.int32)


def assert_within_one_lsb(ours: torch.Tensor, alone: torch.Tensor) -> None:
    assert ours.shape == alone.shape
    assert np.abs(pcm(ours) - pcm(alone)).max(initial=0) <= 1


def codes_for(schedule: list[int], seed: int) -> torch.Tensor:
    frames = sum(schedule) + sum(LATER)
    return torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(seed))


def chunks(codes: torch.Tensor, sizes: list[int]) -> Iterator[torch.Tensor]:
    start = 0
    for size in sizes:
        yield codes[:, start:start + size]
        start += size


def test_batched_streams_match_each_stream_decoded_alone(tiny_loaded) -> None:
    decoder = tiny_loaded.code2wav
    codes = [codes_for(schedule, seed) for seed, schedule in enumerate(SCHEDULES)]
    batched = [ExactCode2WavStream(decoder) for _ in SCHEDULES]
    alone = [ExactCode2WavStream(decoder) for _ in SCHEDULES]
    pending = [chunks(c, [n for n in schedule if n]) for c, schedule in zip(codes, SCHEDULES, strict=True)]
    shared_passes = 0
    for round_ in range(max(map(len, SCHEDULES))):
        members = [i for i, schedule in enumerate(SCHEDULES) if round_ < len(schedule) and schedule[round_]]
        frames = [next(pending[i]) for i in members]
        keys = [batched[i].batch_key(chunk.shape[-1]) for i, chunk in zip(members, frames, strict=True)]
        shared_passes += len(keys) - len(set(keys))
        for i, chunk, samples in zip(members, frames, decode_batch([batched[i] for i in members], frames),
                                     strict=True):
            assert_within_one_lsb(samples, alone[i].decode(chunk))
    assert shared_passes >= 20  # most rounds stacked several streams
    for i in range(len(SCHEDULES)):  # the held samples were split back to the right streams
        for chunk in chunks(codes[i][:, sum(SCHEDULES[i]):], LATER):
            assert_within_one_lsb(batched[i].decode(chunk), alone[i].decode(chunk))
        assert batched[i].frames_seen == alone[i].frames_seen == codes[i].shape[1]


def test_a_stream_alone_in_its_group_decodes_bit_identically(tiny_loaded) -> None:
    decoder = tiny_loaded.code2wav
    codes = codes_for(RAMP, seed=7)
    ours, alone = ExactCode2WavStream(decoder), ExactCode2WavStream(decoder)
    reference = make_code2wav_stream(decoder, "left_context", left_context=25)
    reference_alone = make_code2wav_stream(decoder, "left_context", left_context=25)
    silent = ExactCode2WavStream(decoder)
    for chunk in chunks(codes, RAMP):
        exact, approximate, nothing = decode_batch([ours, reference, silent], [chunk, chunk, chunk[:, :0]])
        assert torch.equal(exact, alone.decode(chunk))
        assert torch.equal(approximate, reference_alone.decode(chunk))
        assert nothing.numel() == 0
    assert pcm(exact).any()  # a real signal, not silence


# The step worker ----------------------------------------------------------------------


class RecordingCode2Wav(BatchedCode2WavProgram):
    """The real program, recording what the worker asked of it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[list[str]] = []
        self.single_steps = 0

    def step(self, request_id, emit):
        self.single_steps += 1
        super().step(request_id, emit)

    def step_batch(self, request_ids, emit):
        self.batches.append(list(request_ids))
        super().step_batch(request_ids, emit)


class Outputs:
    """What a worker emitted and failed, per request; `done` once `expected` requests ended."""

    def __init__(self, expected: int):
        self.events: dict[str, list[object]] = {}
        self.errors: dict[str, Exception] = {}
        self.expected = expected
        self.done = threading.Event()

    def event(self, role: str, request_id: str, event: object) -> None:
        self.events.setdefault(request_id, []).append(event)
        self._count()

    def error(self, role: str, request_id: str, exc: Exception) -> None:
        self.errors[request_id] = exc
        self._count()

    def _count(self) -> None:
        ended = sum(isinstance(e[-1], StageDone) for e in self.events.values()) + len(self.errors)
        if ended >= self.expected:
            self.done.set()


def chunk_messages(seed: int, sizes: list[int]) -> list[CodecChunk]:
    codes = torch.randint(0, 2048, (16, sum(sizes)), generator=torch.Generator().manual_seed(seed))
    pieces = list(chunks(codes, sizes))
    return [CodecChunk(piece, final=i == len(pieces) - 1) for i, piece in enumerate(pieces)]


def run_worker(worker: StageWorker, messages: dict[str, list[CodecChunk]], outputs: Outputs,
               drops: tuple[str, ...] = ()) -> None:
    """Queue every message (and drop) before the worker starts, so its first round sees them all."""
    for request_id, chunk_list in messages.items():
        for chunk in chunk_list:
            worker.submit(request_id, chunk)
    for request_id in drops:
        worker.drop(request_id)
    worker.start()
    try:
        assert outputs.done.wait(60)
    finally:
        worker.stop()


def worker_for(program: Code2WavProgram, outputs: Outputs) -> StageWorker:
    return StageWorker("code2wav", program, outputs.event, outputs.error, max_active=8)


def stepped_alone(program: Code2WavProgram, request_id: str, messages: list[CodecChunk]) -> list[object]:
    events: list[object] = []
    for chunk in messages:
        program.accept(request_id, chunk)
        program.step(request_id, lambda _, event: events.append(event))
    return events


def test_the_worker_steps_each_round_in_one_batch(tiny_loaded) -> None:
    sizes = [1, 1, 2, 4]
    messages = {f"r{i}": chunk_messages(i, sizes) for i in range(4)}
    program = RecordingCode2Wav(tiny_loaded)
    assert isinstance(program, BatchedStageProgram)
    outputs = Outputs(expected=3)
    run_worker(worker_for(program, outputs), messages, outputs, drops=("r3",))
    assert program.single_steps == 0
    assert program.batches == [["r0", "r1", "r2"]] * len(sizes)  # one call per round; r3 dropped first
    assert "r3" not in outputs.events and not outputs.errors
    for request_id in ("r0", "r1", "r2"):
        expected = stepped_alone(Code2WavProgram(tiny_loaded), request_id, messages[request_id])
        ours = outputs.events[request_id]
        assert [type(e) for e in ours] == [type(e) for e in expected]
        assert ours[-1] == expected[-1] == StageDone("stop", len(sizes))
        for mine, theirs in zip(ours[:-1], expected[:-1], strict=True):
            assert mine.final == theirs.final
            assert_within_one_lsb(torch.from_numpy(mine.samples), torch.from_numpy(theirs.samples))


def test_the_first_request_of_a_batch_is_sent_before_the_rest_is_decoded(tiny_loaded) -> None:
    # A new answer's one-frame first chunk (most urgent: its listener hears nothing yet), then
    # two answers' 25-frame chunks that share one conv pass.
    program = BatchedCode2WavProgram(tiny_loaded)
    for request_id, seed, frames in (("new", 1, 1), ("old-a", 2, 25), ("old-b", 3, 25)):
        program.accept(request_id, chunk_messages(seed, [frames, 1])[0])
    streams = program._streams
    seen_when_sent: dict[str, dict[str, int]] = {}

    def emit(request_id: str, event: object) -> None:
        if isinstance(event, AudioSamples):
            seen_when_sent[request_id] = {rid: stream.frames_seen for rid, stream in streams.items()}

    program.step_batch(["new", "old-a", "old-b"], emit)
    assert list(seen_when_sent) == ["new", "old-a", "old-b"]
    assert seen_when_sent["new"] == {"new": 1, "old-a": 0, "old-b": 0}  # sent before the others' decode
    assert seen_when_sent["old-a"] == {"new": 1, "old-a": 25, "old-b": 25}  # the pair decoded together


def test_an_abort_between_rounds_takes_effect(tiny_loaded) -> None:
    program = RecordingCode2Wav(tiny_loaded)
    outputs = Outputs(expected=1)
    dropped_in: list[int] = []  # the batch during which the abort arrived

    def on_event(role: str, request_id: str, event: object) -> None:
        outputs.event(role, request_id, event)
        if request_id == "aborted" and isinstance(event, AudioSamples):
            dropped_in.append(len(program.batches) - 1)
            worker.drop(request_id)

    worker = StageWorker("code2wav", program, on_event, outputs.error, max_active=8)
    sizes = [1, 1, 1, 1, 2]
    run_worker(worker, {"kept": chunk_messages(0, sizes), "aborted": chunk_messages(1, sizes)}, outputs)
    assert dropped_in == [0] and program.batches[0] == ["kept", "aborted"]
    assert program.batches[1:] == [["kept"]] * (len(sizes) - 1)
    assert len(outputs.events["aborted"]) == 1
    assert isinstance(outputs.events["kept"][-1], StageDone) and not outputs.errors


def test_a_failing_batch_fails_its_requests_only(tiny_loaded) -> None:
    bad = CodecChunk(torch.full((16, 2), 40000), final=True)  # codec ids past every codebook
    program = RecordingCode2Wav(tiny_loaded)
    outputs = Outputs(expected=2)
    run_worker(worker_for(program, outputs), {"good": chunk_messages(0, [2]), "bad": [bad]}, outputs)
    assert set(outputs.errors) == {"good", "bad"}  # one call: its failure concerns both
    assert program.request_ids() == []
    later = Outputs(expected=1)
    run_worker(worker_for(program, later), {"next": chunk_messages(2, [2, 1])}, later)
    assert isinstance(later.events["next"][-1], StageDone) and not later.errors


def test_batching_is_off_unless_the_stage_asks_and_only_torch_stages_can(tmp_path: Path) -> None:
    assert not issubclass(Code2WavProgram, BatchedStageProgram)
    served = load_deploy_config(get_deploy_config_path("qwen3_omni_tiny_cpu"), platform="cpu")
    assert not any(stage.batch_requests for stage in served.stages)
    path = tmp_path / "deploy.yaml"
    path.write_text(f"base_config: {get_deploy_config_path('qwen3_omni_tiny_cpu')}\n"
                    "stages:\n  - stage_id: 0\n    batch_requests: true\n")
    with pytest.raises(ConfigError, match=r"stages\[0\]\.batch_requests: needs backend 'torch'"):
        load_deploy_config(path, platform="cpu")


# The engine ---------------------------------------------------------------------------

PROMPTS = ("Tell me about the sea.", "What is a cloud?", "Sing a song.", "Count to five.")


def spoken(text: str) -> OmniRequest:
    return OmniRequest([Message("user", text=text)], speaker="Ethan",
                       sampling={"thinker": {"max_tokens": 8}, "talker": {"max_tokens": 24}})


@pytest.fixture
def gathered_code2wav(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """code2wav waits until every request of the test holds state in it, so its first round
    is one batch of all of them; returns the batches it ran."""
    batches: list[list[str]] = []
    released = threading.Event()
    runnable, step_batch = BatchedCode2WavProgram.runnable, BatchedCode2WavProgram.step_batch

    def gated_runnable(self: BatchedCode2WavProgram) -> list[str]:
        if len(self.request_ids()) >= len(PROMPTS):
            released.set()
        return runnable(self) if released.is_set() else []

    def recorded_step_batch(self: BatchedCode2WavProgram, request_ids: list[str], emit) -> None:
        batches.append(list(request_ids))
        step_batch(self, request_ids, emit)

    monkeypatch.setattr(BatchedCode2WavProgram, "runnable", gated_runnable)
    monkeypatch.setattr(BatchedCode2WavProgram, "step_batch", recorded_step_batch)
    return batches


@pytest.fixture(scope="module")
def ramp_engine(tiny_loaded):
    engine = make_engine(tiny_loaded, first=1, later=4, batch_code2wav=True)  # chunks of 1, 1, 1, 1, 2, 3, 4, 4, ...
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def one_at_a_time(ramp_engine) -> list[dict]:
    return [asyncio.run(run_request(ramp_engine, spoken(text))) for text in PROMPTS]


def test_concurrent_requests_sound_as_when_run_one_at_a_time(ramp_engine, one_at_a_time,
                                                             gathered_code2wav) -> None:
    async def all_at_once() -> list[dict]:
        return await asyncio.gather(*(run_request(ramp_engine, spoken(text)) for text in PROMPTS))

    assert all(alone["pcm"].size for alone in one_at_a_time)  # else the gate never opens
    together = asyncio.run(all_at_once())
    assert len(gathered_code2wav[0]) == len(PROMPTS)
    for alone, ours in zip(one_at_a_time, together, strict=True):
        assert ours["final"].finish_reason in ("stop", "length") and ours["final"].error is None
        assert np.array_equal(ours["codes"], alone["codes"])
        assert ours["pcm"].shape == alone["pcm"].shape and ours["pcm"].size > 0
        assert np.abs(ours["pcm"] - alone["pcm"]).max() <= 1
