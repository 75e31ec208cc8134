"""Qwen2.5-Omni's three stage programs on the torch backend (see `engine/stage_api.py`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

import torch

from vllm_omni.engine.stage_api import AudioSamples, Emit, StageDone
from vllm_omni.models.qwen2_5_omni.checkpoint import Qwen25OmniCheckpoint
from vllm_omni.models.qwen2_5_omni.messages import (
    SAMPLE_RATE,
    ReplyRow,
    TalkerJob,
    ThinkerPrompted,
    Token2WavJob,
)
from vllm_omni.models.qwen2_5_omni.torch_backend.talker import TalkerSequence, TorchTalker
from vllm_omni.models.qwen2_5_omni.torch_backend.thinker import TorchThinker
from vllm_omni.models.qwen2_5_omni.torch_backend.token2wav import Token2WavStream, Windows, solve_windows
from vllm_omni.models.qwen3_omni.messages import CodecChunk, CodecFrame, ThinkerJob
from vllm_omni.models.qwen3_omni.torch_backend.programs import TalkerProgram as _Qwen3TalkerProgram
from vllm_omni.models.qwen3_omni.torch_backend.programs import ThinkerProgram as _Qwen3ThinkerProgram
from vllm_omni.models.qwen3_omni.torch_backend.thinker import ThinkerSequence


class ThinkerProgram(_Qwen3ThinkerProgram):
    """Qwen3-Omni's thinker program; its steps also emit the talker's rows."""

    runner_class = TorchThinker

    def _prefill(self, seq: ThinkerSequence, job: ThinkerJob) -> tuple[int, object | None]:
        token, rows = self.runner.prefill(seq)
        return token, ThinkerPrompted(job.prompt, rows, token) if job.report_prefill and not seq.finished else None

    def _decode(self, seq: ThinkerSequence, job: ThinkerJob) -> tuple[int, object | None]:
        token, row = self.runner.decode(seq)
        return token, ReplyRow(row) if job.report_prefill else None


@dataclass
class _TalkerState:
    job: TalkerJob
    seq: TalkerSequence
    rows: deque[torch.Tensor] = field(default_factory=deque)
    thinker_finished: bool = False
    text_end_sent: bool = False
    prefilled: bool = False

    def take(self, message: ReplyRow) -> None:
        self.rows.append(message.row)


class TalkerProgram(_Qwen3TalkerProgram):
    """Qwen3-Omni's request table; the answer arrives as rows, one per step."""

    job_type, text_type, state_class = TalkerJob, ReplyRow, _TalkerState

    def __init__(self, checkpoint: Qwen25OmniCheckpoint):  # not super().__init__: no bridge, this family's runner
        self.runner = TorchTalker(checkpoint)
        self._requests: dict[str, _TalkerState] = {}

    def runnable(self) -> list[str]:
        return [rid for rid, s in self._requests.items() if not s.prefilled or s.rows or s.thinker_finished]

    def _next_row(self, state: _TalkerState) -> torch.Tensor:
        """The next answer row; once the answer is spent, the text end, then pads."""
        if state.rows:
            return state.rows.popleft()
        if not state.text_end_sent:
            state.text_end_sent = True
            return self.runner.text_end_row
        return self.runner.text_pad_row

    def step(self, request_id: str, emit: Emit) -> None:
        state = self._requests[request_id]
        seq = state.seq
        if not state.prefilled:
            code = self.runner.prefill(seq, state.job)
            state.prefilled = True
        else:
            code = self.runner.decode(seq, self._next_row(state))
        if not self.runner.stopped(seq):
            emit(request_id, CodecFrame((code,)))
        if self.runner.finished(seq):
            spoken = len(seq.codes) - self.runner.stopped(seq)
            emit(request_id, StageDone("stop" if self.runner.stopped(seq) else "length", spoken))
            self.drop(request_id)


class Token2WavProgram:
    """Codes in chunks (`CodecChunk` [1, n]) after a `Token2WavJob`; samples out as windows
    complete (torch_backend/token2wav.py)."""

    def __init__(self, checkpoint: Qwen25OmniCheckpoint, windows: Windows):
        self.token2wav = checkpoint.token2wav
        self.windows = windows
        self._streams: dict[str, Token2WavStream] = {}
        self._chunks_out: dict[str, int] = {}

    def accept(self, request_id: str, message: object) -> None:
        if isinstance(message, Token2WavJob):
            windows = replace(self.windows, one_shot=message.one_shot)
            self._streams[request_id] = Token2WavStream(self.token2wav, message.voice, message.seed, windows)
            self._chunks_out[request_id] = 0
        elif isinstance(message, CodecChunk):
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.add(message.frames[0].tolist(), message.final)
        else:
            raise TypeError(f"code2wav cannot take {type(message).__name__}")

    def drop(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._chunks_out.pop(request_id, None)

    def runnable(self) -> list[str]:
        return [rid for rid, stream in self._streams.items() if stream.ready()]

    def request_ids(self) -> list[str]:
        return list(self._streams)

    def step(self, request_id: str, emit: Emit) -> None:
        self._deliver(request_id, self._streams[request_id].step(), emit)

    def _deliver(self, request_id: str, samples: torch.Tensor, emit: Emit) -> None:
        stream = self._streams[request_id]
        if samples.numel():
            self._chunks_out[request_id] += 1
            emit(request_id, AudioSamples(samples.numpy(), SAMPLE_RATE, final=stream.finished))
        if stream.finished:
            emit(request_id, StageDone("stop", self._chunks_out[request_id]))
            self.drop(request_id)


class BatchedToken2WavProgram(Token2WavProgram):
    """Token2WavProgram stepping a round's requests in one call (engine/stage_api.py's
    BatchedStageProgram), for stages with `batch_requests`: windows of one length are solved
    in one batched DiT solve (`solve_windows`), then each request's audio is vocoded and sent."""

    def step_batch(self, request_ids: list[str], emit: Emit) -> None:
        streams = [self._streams[rid] for rid in request_ids]
        windows = [stream.next_window() for stream in streams]
        solving = [i for i, window in enumerate(windows) if window is not None]
        solve_windows([streams[i] for i in solving], [windows[i] for i in solving])
        for request_id, stream in zip(request_ids, streams, strict=True):
            self._deliver(request_id, stream.vocode(), emit)
