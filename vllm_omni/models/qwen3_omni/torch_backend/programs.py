"""Qwen3-Omni's three stage programs on the torch backend (see `engine/stage_api.py`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from vllm_omni.engine.stage_api import AudioSamples, Emit, StageDone, TextToken
from vllm_omni.models.qwen3_omni.checkpoint import Qwen3OmniCheckpoint
from vllm_omni.models.qwen3_omni.messages import (
    SAMPLE_RATE,
    CodecChunk,
    CodecFrame,
    TalkerJob,
    ThinkerFinished,
    ThinkerJob,
    ThinkerPrefilled,
    TrailingText,
)
from vllm_omni.models.qwen3_omni.talker_bridge import ThinkerToTalkerBridge
from vllm_omni.models.qwen3_omni.torch_backend.code2wav import (
    Code2WavStream,
    decode_groups,
    make_code2wav_stream,
)
from vllm_omni.models.qwen3_omni.torch_backend.talker import TalkerSequence, TorchTalker
from vllm_omni.models.qwen3_omni.torch_backend.thinker import ThinkerSequence, TorchThinker

# Thinker ------------------------------------------------------------------------------


class ThinkerProgram:
    runner_class: type = TorchThinker  # a family whose thinker differs names its runner here

    def __init__(self, checkpoint: Qwen3OmniCheckpoint):
        self.runner = self.runner_class(checkpoint)
        self._requests: dict[str, tuple[ThinkerSequence, ThinkerJob]] = {}
        self._prefilled: set[str] = set()

    def accept(self, request_id: str, message: object) -> None:
        if not isinstance(message, ThinkerJob):
            raise TypeError(f"thinker cannot take {type(message).__name__}")
        self._requests[request_id] = (self.runner.new_sequence(message.prompt, message.sampling), message)

    def drop(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._prefilled.discard(request_id)

    def runnable(self) -> list[str]:
        return list(self._requests)

    def request_ids(self) -> list[str]:
        return list(self._requests)

    def _prefill(self, seq: ThinkerSequence, job: ThinkerJob) -> tuple[int, object | None]:
        """The prompt's step: the first token, and what the talker is told (None: nothing)."""
        prefill = self.runner.prefill(seq)
        report = ThinkerPrefilled(job.prompt, prefill) if job.report_prefill and not seq.finished else None
        return prefill.first_token, report

    def _decode(self, seq: ThinkerSequence, job: ThinkerJob) -> tuple[int, object | None]:
        """A decode step: the next token, and what the talker is told (None: nothing)."""
        return self.runner.decode(seq), None

    def step(self, request_id: str, emit: Emit) -> None:
        seq, job = self._requests[request_id]
        if request_id not in self._prefilled:
            self._prefilled.add(request_id)
            token, report = self._prefill(seq, job)
        else:
            token, report = self._decode(seq, job)
        if report is not None:
            emit(request_id, report)
        emit(request_id, TextToken(token, fed=not seq.finished))
        if seq.finished:
            emit(request_id, StageDone(seq.finish_reason, len(seq.generated)))
            self.drop(request_id)


# Talker -------------------------------------------------------------------------------


@dataclass
class _TalkerState:
    job: TalkerJob
    seq: TalkerSequence
    trailing: deque[int] = field(default_factory=deque)
    thinker_finished: bool = False
    eos_sent: bool = False
    prefilled: bool = False
    next_codec_sum: torch.Tensor | None = None  # input of the next step, before its text row

    def take(self, message: TrailingText) -> None:
        self.trailing.extend(message.token_ids)


class TalkerProgram:
    # A family whose talker differs names here the message that opens a request, the one that
    # carries the thinker's answer, and its per-request state (made from the job and a sequence;
    # its `take` keeps an answer message)
    job_type: type = TalkerJob
    text_type: type = TrailingText
    state_class: type = _TalkerState

    def __init__(self, checkpoint: Qwen3OmniCheckpoint):
        self.runner = TorchTalker(checkpoint)
        self.bridge = ThinkerToTalkerBridge(checkpoint)
        self._requests: dict[str, _TalkerState] = {}

    def accept(self, request_id: str, message: object) -> None:
        if isinstance(message, self.job_type):
            self._requests[request_id] = self.state_class(message, self.runner.new_sequence(message.sampling))
            return
        state = self._requests.get(request_id)
        if state is None:  # the request ended or was aborted; its text arrives late
            return
        if isinstance(message, ThinkerFinished):
            state.thinker_finished = True
        elif isinstance(message, self.text_type):
            state.take(message)
        else:
            raise TypeError(f"talker cannot take {type(message).__name__}")

    def drop(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def request_ids(self) -> list[str]:
        return list(self._requests)

    def _text_ready(self, state: _TalkerState) -> bool:
        return bool(state.trailing) or state.thinker_finished

    def runnable(self) -> list[str]:
        return [rid for rid, s in self._requests.items()
                if not s.prefilled or s.next_codec_sum is None or self._text_ready(s)]

    def _next_text_row(self, state: _TalkerState) -> torch.Tensor:
        if state.trailing:
            return self.bridge.trailing_rows([state.trailing.popleft()])[0]
        tts = self.bridge.tts_rows()
        if not state.eos_sent:
            state.eos_sent = True
            return tts.eos[0]
        return tts.pad[0]

    def step(self, request_id: str, emit: Emit) -> None:
        state = self._requests[request_id]
        runner, seq = self.runner, state.seq
        if not state.prefilled:
            job = state.job
            runner.prefill(seq, self.bridge.prompt_embeddings(job.prompt.input_ids, job.prefill, job.speaker),
                           *self.bridge.prompt_positions(job.prompt))
            state.prefilled = True
        elif state.next_codec_sum is not None and self._text_ready(state):
            runner.decode(seq, state.next_codec_sum + self._next_text_row(state))
            state.next_codec_sum = None
        if runner.finished(seq):
            emit(request_id, StageDone("stop" if seq.codes0[-1] == runner.eos_token_id else "length",
                                       len(seq.codes0) - 1))
            self.drop(request_id)
            return
        if state.next_codec_sum is None:
            codes, state.next_codec_sum = runner.complete_frame(seq)
            emit(request_id, CodecFrame(tuple(codes)))


# Code2wav -----------------------------------------------------------------------------


class Code2WavProgram:
    def __init__(self, checkpoint: Qwen3OmniCheckpoint, mode: str = "exact", left_context: int = 25):
        self.code2wav = checkpoint.code2wav
        self.mode, self.left_context = mode, left_context
        self._streams: dict[str, Code2WavStream] = {}
        self._pending: dict[str, deque[CodecChunk]] = {}
        self._chunks_out: dict[str, int] = {}

    def accept(self, request_id: str, message: object) -> None:
        if not isinstance(message, CodecChunk):
            raise TypeError(f"code2wav cannot take {type(message).__name__}")
        if request_id not in self._streams:
            self._streams[request_id] = make_code2wav_stream(self.code2wav, self.mode, self.left_context)
            self._pending[request_id] = deque()
            self._chunks_out[request_id] = 0
        self._pending[request_id].append(message)

    def drop(self, request_id: str) -> None:
        for table in (self._streams, self._pending, self._chunks_out):
            table.pop(request_id, None)

    def runnable(self) -> list[str]:
        return [rid for rid, chunks in self._pending.items() if chunks]

    def request_ids(self) -> list[str]:
        return list(self._streams)

    def step(self, request_id: str, emit: Emit) -> None:
        chunk = self._pending[request_id].popleft()
        self._deliver(request_id, chunk, self._streams[request_id].decode(chunk.frames), emit)

    def _deliver(self, request_id: str, chunk: CodecChunk, samples: torch.Tensor, emit: Emit) -> None:
        if samples.numel():
            self._chunks_out[request_id] += 1
            emit(request_id, AudioSamples(samples.float().cpu().numpy(), SAMPLE_RATE, final=chunk.final))
        if chunk.final:
            emit(request_id, StageDone("stop", self._chunks_out[request_id]))
            self.drop(request_id)


class BatchedCode2WavProgram(Code2WavProgram):
    """Code2WavProgram stepping a round's requests in one call (engine/stage_api.py's
    BatchedStageProgram), for stages with `batch_requests` (config/schema.py)."""

    def step_batch(self, request_ids: list[str], emit: Emit) -> None:
        """One pending chunk of each request, their conv stacks shared where the streams
        allow (`decode_groups`); each request's events are those `step` would emit, sent as
        soon as its group is decoded, the first request's group first."""
        chunks = [self._pending[rid].popleft() for rid in request_ids]
        decoded = decode_groups([self._streams[rid] for rid in request_ids], [chunk.frames for chunk in chunks])
        for index, samples in decoded:
            self._deliver(request_ids[index], chunks[index], samples, emit)
