"""The engine the session layer talks to: stage workers, request tracking, outputs.

`OmniEngine(family)` drives any model family (`engine/family.py`) through the stage graph
its deploy config declares (`engine/graph.py`). `generate(request)` validates the request,
renders its prompt (`engine/prompting.py`), submits it to the first stage and yields its
outputs as they appear: text deltas, PCM16 audio chunks, and one final `RequestFinished`.
Stage events are routed in the worker thread that produced them (under one short lock), so
a ready audio chunk is forwarded at once, whatever the other stages are doing.

When a request ends, however it ends, every stage is told to drop it, so no stage keeps
working on (or counting) a request whose final record is out. A stage with `replicas` runs
several instances (engine/replicas.py). A watcher thread checks their health
(engine/stage_watch.py): a replica that dies fails the requests it holds at once, a stage
with no replica alive fails every in-flight request, and new requests are refused until
it is back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from vllm_omni.audio.pcm import float_to_pcm16_bytes
from vllm_omni.engine.backends import ray_stage
from vllm_omni.engine.backends.async_stage import AsyncEngineStage
from vllm_omni.engine.backends.ray_stage import RayStageReplica
from vllm_omni.engine.backends.step_worker import StageWorker
from vllm_omni.engine.detokenizer import IncrementalDetokenizer
from vllm_omni.engine.family import ModelFamily, Route, ToolCallParser
from vllm_omni.engine.graph import check_stage_graph, replica_name, stage_name
from vllm_omni.engine.pacing import PlaybackPacer
from vllm_omni.engine.prompting import render_conversation, request_sampling
from vllm_omni.engine.replicas import ReplicaStats, StageReplicas
from vllm_omni.engine.request import (
    AudioChunk,
    AudioInputStream,
    EngineBusyError,
    EngineOutput,
    FinishReason,
    OmniRequest,
    RequestError,
    RequestFinished,
    StageUnavailableError,
    TextDelta,
    ToolCall,
    Usage,
)
from vllm_omni.engine.stage_api import AsyncStageDriver, AudioSamples, StageDone, StageOutput, TextToken
from vllm_omni.engine.stage_timing import StageTimer
from vllm_omni.engine.stage_watch import StageWatcher
from vllm_omni.engine.stop_strings import StopStrings, checked_stop_strings
from vllm_omni.engine.tools import offered_tools

logger = logging.getLogger(__name__)

MODALITIES = ("text", "audio")
STALL_TIMEOUT_S = 300.0  # a request that produces nothing for this long is failed


@dataclass
class _Record:
    request: OmniRequest
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    route: Any  # the family's per-request routing state
    detokenizer: IncrementalDetokenizer
    prompt_tokens: int
    image_tokens: int  # of prompt_tokens
    input_audio_tokens: int  # of prompt_tokens
    cached_tokens: int = 0  # of prompt_tokens, from the text stage's prefix cache
    tool_parser: ToolCallParser | None = None  # when the request offers tools
    tool_calls: list[ToolCall] = field(default_factory=list)
    stops: StopStrings[object] | None = None  # holds the text stage's events when the request has stop strings
    text_stopped: bool = False  # a stop string ended the text stage: its later events are ignored
    timer: StageTimer = field(default_factory=StageTimer)
    finish_reason: FinishReason = FinishReason.STOP
    audio_samples: int = 0
    sample_rate: int = 0
    first_audio_s: float | None = None
    finished: bool = False


class OmniEngine:
    def __init__(self, family: ModelFamily, max_waiting_factor: int = 4):
        self.family = family
        self.deploy = family.deploy
        self._edges = check_stage_graph(self.deploy, family.name, family.roles, family.edges)
        self._outer_torch_threads = torch.get_num_threads()  # the process's, restored at shutdown
        if self.deploy.server_torch_threads is not None:
            torch.set_num_threads(self.deploy.server_torch_threads)
        self._records: dict[str, _Record] = {}
        self._lock = threading.Lock()
        if self.deploy.ray is not None:
            ray_stage.connect(self.deploy.ray)
        self.workers = {role: self._stage_replicas(role) for role in family.roles}
        self.max_requests = max_waiting_factor * self.workers[family.text_role].max_active
        self.pacer = PlaybackPacer(self.deploy.playback_pacing)
        if self.deploy.playback_pacing.enabled:  # off: no stage hears of playback (no RPC per audio chunk)
            self.pacer.listeners = [worker.update_pace for worker in self.workers.values()]
        for worker in self.workers.values():
            worker.start()
        self._watcher = StageWatcher(self.deploy, self.workers, self._fail_requests)
        self._watcher.start()

    def _stage_replicas(self, role: str) -> StageReplicas:
        stage = self.deploy.stage_by_role(role)
        max_active = stage.engine_args.max_num_seqs or 8
        replicas: list[StageWorker | AsyncEngineStage | RayStageReplica] = []
        for replica_stage in stage.replica_stages():
            if self.deploy.ray is not None:
                replicas.append(RayStageReplica(role, self.family.remote_program(replica_stage), self._on_event,
                                                self._on_error, max_active, replica_stage.placement, self.deploy.ray))
                continue
            program = self.family.make_program(replica_stage)
            stage_kind = AsyncEngineStage if isinstance(program, AsyncStageDriver) else StageWorker
            replicas.append(stage_kind(role, program, self._on_event, self._on_error, max_active=max_active))
        return StageReplicas(role, replicas)

    # Public interface -------------------------------------------------------------------

    def create_audio_stream(self) -> AudioInputStream:
        return self.family.audio_stream()

    @property
    def speakers(self) -> list[str]:
        return self.family.speakers

    @property
    def default_speaker(self) -> str | None:
        return self.family.default_speaker

    @property
    def output_sample_rate(self) -> int:
        return self.family.output_sample_rate

    @property
    def accepts_images(self) -> bool:
        return self.deploy.stage_by_role(self.family.text_role).engine_args.mm_limit("image") > 0

    async def generate(self, request: OmniRequest) -> AsyncIterator[EngineOutput]:
        """Submit `request` and stream its outputs; raises RequestError for bad input."""
        record = self._admit(request)
        try:
            while True:
                try:
                    item = await asyncio.wait_for(record.queue.get(), timeout=STALL_TIMEOUT_S)
                except asyncio.TimeoutError:
                    self._finish(record, "error", f"no output for {STALL_TIMEOUT_S:.0f} s")
                    continue
                if isinstance(item, RequestFinished):
                    yield item
                    return
                if record.finish_reason != "abort":  # outputs already on their way when aborted are dropped
                    yield item
        finally:
            if not record.finished:  # the caller stopped listening: free everything
                self._abort(request.request_id)

    async def abort(self, request_id: str) -> bool:
        """Stop a request in every stage (within one step); False if it is not running."""
        return self._abort(request_id)

    def num_active_requests(self) -> int:
        """Requests not finished, or still holding state in some stage."""
        with self._lock:
            unfinished = len(self._records)
        return max(unfinished, *(w.num_requests() for w in self.workers.values()))

    def active_requests_by_stage(self) -> dict[str, int]:
        """Requests holding state in each stage, by role."""
        return {role: worker.num_requests() for role, worker in self.workers.items()}

    def unhealthy_stages(self) -> list[str]:
        """Stages with no replica alive: each one's workers or engines have died or are
        restarting (requests are refused)."""
        return [role for role, worker in self.workers.items() if not worker.healthy()]

    def replica_stats(self) -> list[ReplicaStats]:
        return [stats for worker in self.workers.values() for stats in worker.stats()]

    def shutdown(self) -> None:
        self._watcher.stop()
        for worker in self.workers.values():
            worker.stop()
        torch.set_num_threads(self._outer_torch_threads)

    # Admission --------------------------------------------------------------------------

    def _stage_names(self, roles: list[str]) -> str:
        return ", ".join(stage_name(self.deploy, role) for role in roles)

    def _admit(self, request: OmniRequest) -> _Record:
        dead = self.unhealthy_stages()
        if dead:
            raise StageUnavailableError(f"stage {self._stage_names(dead)} is unavailable; retry later")
        unknown = set(request.modalities) - set(MODALITIES)
        if unknown or "text" not in request.modalities:
            raise RequestError(f"modalities: expected 'text' or 'text'+'audio', got {list(request.modalities)}")
        wants_audio = "audio" in request.modalities
        sampling = request_sampling(self.family, request)
        speaker = request.speaker or self.default_speaker
        if wants_audio and speaker is not None:
            try:
                self.family.check_speaker(speaker)
            except ValueError as exc:
                raise RequestError(f"speaker: {exc}") from None
        stops = checked_stop_strings(request.stop)
        tools, forced = offered_tools(request)
        prompt = render_conversation(self.family, request.messages, tools, call_tool=forced is not None)
        with self._lock:
            if request.request_id in self._records:
                raise RequestError(f"request_id {request.request_id!r} is already running")
            if len(self._records) >= self.max_requests:
                raise EngineBusyError(f"engine is at capacity ({self.max_requests} requests); retry later")
            route, messages = self.family.start(request.request_id, prompt, sampling, speaker, wants_audio, forced)
            record = _Record(request=request, loop=asyncio.get_running_loop(), queue=asyncio.Queue(),
                             route=route, detokenizer=IncrementalDetokenizer(self.family.tokenizer),
                             prompt_tokens=len(prompt), image_tokens=prompt.image_tokens,
                             input_audio_tokens=prompt.audio_tokens, stops=StopStrings(stops) if stops else None,
                             tool_parser=self.family.tool_call_parser(forced is not None) if tools else None)
            self._records[request.request_id] = record
            if wants_audio:
                self.pacer.add(request.request_id)
            self._submit(record, None, messages)
        return record

    def _submit(self, record: _Record, source: str | None, messages: Route) -> None:
        """Hand each message to its stage; a family may only send along declared connectors
        (the first messages of a request come from outside, `source` None)."""
        request = record.request
        for role, message in messages:
            if source is not None and (source, role) not in self._edges:
                raise RuntimeError(f"{self.family.name} routed a message from {source} to {role} "
                                   "without a connector")
            self.workers[role].submit(request.request_id, message, request.affinity_key)

    # Events from stage workers (any thread) ---------------------------------------------

    def _push(self, record: _Record, item: EngineOutput) -> None:
        try:
            record.loop.call_soon_threadsafe(record.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is gone
            logger.warning("dropping output of %s: its event loop is closed", record.request.request_id)

    def _on_event(self, role: str, request_id: str, event: object) -> None:
        with self._lock:
            record = self._records.get(request_id)
            if record is None or record.finished or (record.text_stopped and role == self.family.text_role):
                return
            if isinstance(event, StageOutput):
                since_arrival = record.timer.record(role)
            if record.stops is not None and role == self.family.text_role:
                self._on_text_event_held(record, record.stops, role, event)
                return
            if isinstance(event, TextToken):
                self._push_text(record, *self._on_token(record, event.token_id))
            elif isinstance(event, AudioSamples):
                self._push_audio(record, event, since_arrival)
            self._route(record, role, event)

    def _route(self, record: _Record, role: str, event: object) -> None:
        if isinstance(event, StageDone):
            self.workers[role].done(record.request.request_id)  # it no longer loads its replica there
        if isinstance(event, StageDone) and role == self.family.text_role:
            record.finish_reason = FinishReason(event.reason)
            record.cached_tokens = max(record.cached_tokens, event.cached_prompt_tokens)  # a stop string's end has 0
            if record.tool_parser is not None:
                self._push_tool_call(record, record.tool_parser.finish())
        self._submit(record, role, self.family.route(record.route, role, event))
        if isinstance(event, StageDone) and role == self.family.final_role(record.route):
            self._finish_locked(record, record.finish_reason)

    def _on_text_event_held(self, record: _Record, stops: StopStrings[object], role: str, event: object) -> None:
        """A text-stage event of a request with stop strings: routed (and its text streamed) only
        once no stop string can include it; a stop string ends the text stage as a "stop" would."""
        released = stops.flush() if isinstance(event, StageDone) else stops.add(
            *(self._on_token(record, event.token_id) if isinstance(event, TextToken) else ("", ())), event)
        self._push_text(record, released.text, released.token_ids)
        for item in released.items:
            self._route(record, role, item)
        if released.stopped:
            record.text_stopped = True
            self.workers[role].drop(record.request.request_id)
            event = StageDone("stop", len(record.timer.stamps.get(role, ())))
        if isinstance(event, StageDone):
            self._route(record, role, event)

    def _on_token(self, record: _Record, token_id: int) -> tuple[str, tuple[int, ...]]:
        """A text-stage token's answer text and the tokens it comes from ("" if it writes a tool call)."""
        if record.tool_parser is not None:
            is_text, call = record.tool_parser.feed(token_id)
            self._push_tool_call(record, call)
            if not is_text:
                return "", ()
        return record.detokenizer.add(token_id)

    def _push_text(self, record: _Record, text: str, token_ids: tuple[int, ...]) -> None:
        if text:
            self._push(record, TextDelta(record.request.request_id, text, token_ids))

    def _push_tool_call(self, record: _Record, call: ToolCall | None) -> None:
        if call is not None:
            record.tool_calls.append(call)
            self._push(record, call)

    def _push_audio(self, record: _Record, event: AudioSamples, since_arrival: float) -> None:
        start_s = record.audio_samples / event.sample_rate
        record.audio_samples += len(event.samples)
        record.sample_rate = event.sample_rate
        self.pacer.delivered(record.request.request_id, len(event.samples) / event.sample_rate)
        if record.first_audio_s is None:
            record.first_audio_s = since_arrival
        pcm = float_to_pcm16_bytes(np.asarray(event.samples))
        self._push(record, AudioChunk(record.request.request_id, pcm, event.sample_rate, start_s,
                                      record.audio_samples / event.sample_rate, final=event.final))

    def _on_error(self, role: str, request_id: str, exc: Exception) -> None:
        with self._lock:
            record = self._records.get(request_id)
            if record is None or record.finished:
                return
            replicas = self.workers[role]
            index = replicas.replica_of(request_id) or 0
            if replicas.replicas[index].healthy():
                self._finish_locked(record, "error", f"{role} stage failed: {type(exc).__name__}: {exc}")
            else:  # the replica died under the request
                self._finish_locked(record, "error", f"stage {replica_name(self.deploy, role, index)} died: "
                                    f"{type(exc).__name__}: {exc}", StageUnavailableError.code)

    # Stage health (watcher thread) --------------------------------------------------------

    def _fail_requests(self, request_ids: list[str] | None, error: str) -> None:
        """End the given in-flight requests (None: all of them): an RPC to a dead vLLM engine
        never returns, so a request waiting on one would never hear of it."""
        with self._lock:
            records = list(self._records.values()) if request_ids is None else \
                [self._records[rid] for rid in request_ids if rid in self._records]
            for record in records:
                self._finish_locked(record, "error", error, StageUnavailableError.code)

    # Ending requests ----------------------------------------------------------------------

    def _finish_locked(self, record: _Record, reason: str, error: str | None = None,
                       error_code: str | None = None) -> None:
        record.finished = True
        request_id = record.request.request_id
        self._records.pop(request_id, None)
        self.pacer.forget(request_id)
        for worker in self.workers.values():  # also after a normal end: a downstream stage that
            worker.drop(request_id)  # ended first leaves the upstream ones with nothing to do
        reason = FinishReason(reason)
        metrics = record.timer.metrics({s.role: s.stage_id for s in self.deploy.stages})
        text_role, audio_role = self.family.text_role, self.family.audio_token_role
        if text_role in metrics:
            metrics[text_role] = replace(metrics[text_role], finish_reason=reason)
        usage = Usage(prompt_tokens=record.prompt_tokens, image_tokens=record.image_tokens,
                      input_audio_tokens=record.input_audio_tokens, cached_tokens=record.cached_tokens,
                      # text tokens include those writing tool calls
                      text_tokens=metrics[text_role].outputs if text_role in metrics else 0,
                      audio_tokens=metrics[audio_role].outputs if audio_role in metrics else 0)
        answer = record.detokenizer if record.stops is None else record.stops  # held text was never streamed
        self._push(record, RequestFinished(
            request_id=request_id, finish_reason=reason, text=answer.text, token_ids=tuple(answer.token_ids),
            usage=usage,
            audio_duration_s=record.audio_samples / record.sample_rate if record.sample_rate else 0.0,
            time_to_first_audio_s=record.first_audio_s, stage_metrics=metrics, error=error,
            error_code=error_code, tool_calls=tuple(record.tool_calls)))

    def _finish(self, record: _Record, reason: str, error: str | None = None) -> None:
        with self._lock:
            if not record.finished:
                self._finish_locked(record, reason, error)

    def _abort(self, request_id: str) -> bool:
        with self._lock:
            record = self._records.get(request_id)
            if record is None or record.finished:
                return False
            record.finish_reason = "abort"
            self._finish_locked(record, "abort")
            return True
