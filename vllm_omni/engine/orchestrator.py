"""The engine the session layer talks to: stage workers, request tracking, outputs.

`OmniEngine.generate(request)` validates the request, renders its prompt, submits it to
the first stage and yields its outputs as they appear: text deltas, PCM16 audio chunks,
and one final `RequestFinished`. Stage events are routed in the worker thread that
produced them (under one short lock), so a ready audio chunk is forwarded at once,
whatever the other stages are doing.

When a request ends, however it ends, every stage is told to drop it, so no stage keeps
working on (or counting) a request whose final record is out. A watcher thread checks the
stages' health: when one dies, every in-flight request fails at once (a request waiting
on a dead engine may otherwise never hear of it), new requests are refused, and a vLLM
stage with `restart_on_failure` gets a new engine.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from vllm_omni.audio.log_mel import log_mel_features
from vllm_omni.audio.pcm import float_to_pcm16, validate_model_audio
from vllm_omni.config import DeployConfig, SamplingParams, load_deploy_config
from vllm_omni.config.errors import describe_validation_error
from vllm_omni.engine.async_stage import AsyncEngineStage
from vllm_omni.engine.detokenizer import IncrementalDetokenizer
from vllm_omni.engine.request import (
    AudioChunk,
    AudioInputStream,
    EngineOutput,
    OmniRequest,
    RequestError,
    RequestFinished,
    StageUnavailableError,
    TextDelta,
)
from vllm_omni.engine.stage_timing import StageTimer
from vllm_omni.engine.stage_worker import StageWorker
from vllm_omni.models.qwen3_omni.checkpoint import load_checkpoint
from vllm_omni.models.qwen3_omni.pipeline import Qwen3OmniPipeline, RouteState
from vllm_omni.models.stage_api import AsyncStageDriver, AudioSamples, StageDone, StageOutput, TextToken

logger = logging.getLogger(__name__)

MODALITIES = ("text", "audio")
STALL_TIMEOUT_S = 300.0  # a request that produces nothing for this long is failed
HEALTH_POLL_S = 0.25  # how often the watcher checks that every stage is alive


@dataclass
class _Record:
    request: OmniRequest
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    route: RouteState
    detokenizer: IncrementalDetokenizer
    prompt_tokens: int
    timer: StageTimer = field(default_factory=StageTimer)
    finish_reason: str = "stop"
    audio_samples: int = 0
    sample_rate: int = 0
    first_audio_s: float | None = None
    finished: bool = False


class OmniEngine:
    def __init__(self, pipeline: Qwen3OmniPipeline, deploy: DeployConfig, max_waiting_factor: int = 4):
        self.pipeline = pipeline
        self.deploy = deploy
        self._records: dict[str, _Record] = {}
        self._lock = threading.Lock()
        self.workers: dict[str, StageWorker | AsyncEngineStage] = {}
        for role, program in pipeline.make_programs().items():
            stage_kind = AsyncEngineStage if isinstance(program, AsyncStageDriver) else StageWorker
            self.workers[role] = stage_kind(role, program, self._on_event, self._on_error,
                                            max_active=deploy.stage_by_role(role).engine_args.max_num_seqs or 8)
        self.max_requests = max_waiting_factor * self.workers["thinker"].max_active
        for worker in self.workers.values():
            worker.start()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch_stages, name="stage-health", daemon=True)
        self._watcher.start()

    @classmethod
    def from_pretrained(cls, model: str | Path, deploy_config: str | Path | DeployConfig,
                        code2wav_mode: str = "exact") -> OmniEngine:
        deploy = deploy_config if isinstance(deploy_config, DeployConfig) else load_deploy_config(deploy_config)
        for stage in deploy.stages:
            if stage.backend == "vllm" and stage.role not in ("thinker", "talker"):
                raise ValueError(f"stage {stage.stage_id} ({stage.role}): backend 'vllm' serves the "
                                 "autoregressive stages (thinker, talker); use backend: torch")
        dtype = deploy.stage_by_role("thinker").engine_args.dtype or "float32"
        # With both autoregressive stages in vLLM engines, this process runs only code2wav and the bridge.
        engines_hold_weights = all(deploy.stage_by_role(role).backend == "vllm" for role in ("thinker", "talker"))
        checkpoint = load_checkpoint(model, dtype=dtype, bridge_only=engines_hold_weights)
        return cls(Qwen3OmniPipeline(checkpoint, deploy, code2wav_mode=code2wav_mode), deploy)

    # Public interface -------------------------------------------------------------------

    @staticmethod
    def create_audio_stream() -> AudioInputStream:
        return AudioInputStream()

    @property
    def speakers(self) -> list[str]:
        """Voice names the talker knows."""
        return sorted(self.pipeline.checkpoint.config.talker_config.speaker_id)

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
        """Stages whose worker or engine has died or is restarting (requests are refused)."""
        return [role for role, worker in self.workers.items() if not worker.healthy()]

    def queue_depths(self) -> dict[str, int]:
        return {role: worker.queue_depth() for role, worker in self.workers.items()}

    def shutdown(self) -> None:
        self._stopping.set()
        self._watcher.join()
        for worker in self.workers.values():
            worker.stop()

    # Admission --------------------------------------------------------------------------

    def _sampling(self, request: OmniRequest, role: str) -> SamplingParams:
        defaults = self.deploy.stage_by_role(role).default_sampling_params
        overrides = request.sampling.get(role, {})
        try:
            return SamplingParams.model_validate({**defaults.model_dump(), **overrides})
        except ValidationError as exc:
            raise RequestError("; ".join(describe_validation_error(exc, ("sampling", role)))) from None

    def _render(self, request: OmniRequest):
        """The thinker prompt. When the conversation outgrows the thinker's audio limit or the
        context, the oldest turns lose their audio, then the oldest turns are left out
        (system instructions and the current turn always stay)."""
        turns: list[tuple[dict[str, Any], Any]] = []  # (chat-template message, its audio features)
        for i, message in enumerate(request.messages):
            turns.append(self._chat_message(message, f"messages[{i}]"))
        if not turns or turns[-1][0]["role"] != "user":
            raise RequestError("messages: the last turn must be the user's")
        self._fit_audio_limit(turns)
        while True:
            prompt = self.pipeline.render([m for m, _ in turns], [f for _, f in turns if f is not None])
            if len(prompt) < self.pipeline.max_model_len:
                return prompt
            oldest = next((i for i, (m, _) in enumerate(turns[:-1]) if m["role"] != "system"), None)
            if oldest is None:
                raise RequestError(f"prompt is {len(prompt)} tokens; the model's context is "
                                   f"{self.pipeline.max_model_len}")
            del turns[oldest]

    def _fit_audio_limit(self, turns: list[tuple[dict[str, Any], Any]]) -> None:
        """Keep at most the thinker's `limit_mm_per_prompt` audio items (vLLM refuses more; the
        torch backend keeps the same limit): the oldest turns with audio lose it, and a turn
        left without text goes. Each turn carries at most one audio item."""
        limit = self.deploy.stage_by_role("thinker").engine_args.mm_limit("audio")
        while sum(features is not None for _, features in turns) > limit:
            oldest = next((i for i, (_, f) in enumerate(turns[:-1]) if f is not None), None)
            if oldest is None:
                raise RequestError(f"the current turn carries audio, but the thinker's limit_mm_per_prompt "
                                   f"allows {limit} audio items per prompt")
            message, _ = turns[oldest]
            text = [part for part in message["content"] if part["type"] != "audio"]
            if text:
                turns[oldest] = ({**message, "content": text}, None)
            else:
                del turns[oldest]

    def _chat_message(self, message, where: str) -> tuple[dict[str, Any], Any]:
        if message.role not in ("system", "user", "assistant"):
            raise RequestError(f"{where}.role: expected system, user or assistant, got {message.role!r}")
        parts: list[dict[str, Any]] = []
        features = None
        if message.audio is not None or message.audio_stream is not None:
            if message.role != "user":
                raise RequestError(f"{where}: only user turns may carry audio")
            if message.audio is not None:
                try:
                    samples = validate_model_audio(message.audio, message.sample_rate, f"{where}.audio")
                except ValueError as exc:
                    raise RequestError(str(exc)) from None
                features = log_mel_features(samples)
            else:
                try:
                    features = message.audio_stream.close()
                except ValueError as exc:
                    raise RequestError(f"{where}.audio_stream: {exc}") from None
            parts.append({"type": "audio"})
        if message.text:
            parts.append({"type": "text", "text": message.text})
        if not parts:
            raise RequestError(f"{where}: has neither text nor audio")
        content = parts[0]["text"] if message.role == "system" and len(parts) == 1 else parts
        return {"role": message.role, "content": content}, features

    def _stage_names(self, roles: list[str]) -> str:
        return ", ".join(f"{role} (stage_id {self.deploy.stage_by_role(role).stage_id})" for role in roles)

    def _admit(self, request: OmniRequest) -> _Record:
        dead = self.unhealthy_stages()
        if dead:
            raise StageUnavailableError(f"stage {self._stage_names(dead)} is unavailable; retry later")
        unknown = set(request.modalities) - set(MODALITIES)
        if unknown or "text" not in request.modalities:
            raise RequestError(f"modalities: expected 'text' or 'text'+'audio', got {list(request.modalities)}")
        wants_audio = "audio" in request.modalities
        thinker_sampling = self._sampling(request, "thinker")
        talker_sampling = self._sampling(request, "talker")
        if wants_audio:
            try:
                self.pipeline.check_speaker(request.speaker)
            except ValueError as exc:
                raise RequestError(f"speaker: {exc}") from None
        prompt = self._render(request)
        with self._lock:
            if request.request_id in self._records:
                raise RequestError(f"request_id {request.request_id!r} is already running")
            if len(self._records) >= self.max_requests:
                raise RequestError(f"engine is at capacity ({self.max_requests} requests); retry later")
            route, messages = self.pipeline.start(request.request_id, prompt, thinker_sampling, talker_sampling,
                                                  request.speaker, wants_audio)
            record = _Record(request=request, loop=asyncio.get_running_loop(), queue=asyncio.Queue(),
                             route=route, detokenizer=IncrementalDetokenizer(self.pipeline.tokenizer),
                             prompt_tokens=len(prompt))
            self._records[request.request_id] = record
            self._submit(request.request_id, messages)
        return record

    def _submit(self, request_id: str, messages: list[tuple[str, object]]) -> None:
        for role, message in messages:
            self.workers[role].submit(request_id, message)

    # Events from stage workers (any thread) ---------------------------------------------

    def _push(self, record: _Record, item: EngineOutput) -> None:
        try:
            record.loop.call_soon_threadsafe(record.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is gone
            logger.warning("dropping output of %s: its event loop is closed", record.request.request_id)

    def _on_event(self, role: str, request_id: str, event: object) -> None:
        with self._lock:
            record = self._records.get(request_id)
            if record is None or record.finished:
                return
            if isinstance(event, StageOutput):
                since_arrival = record.timer.record(role)
            if isinstance(event, TextToken):
                delta, token_ids = record.detokenizer.add(event.token_id)
                if delta:
                    self._push(record, TextDelta(request_id, delta, token_ids))
            elif isinstance(event, AudioSamples):
                self._push_audio(record, event, since_arrival)
            elif isinstance(event, StageDone) and role == "thinker":
                record.finish_reason = event.reason
            self._submit(request_id, self.pipeline.route(record.route, role, event))
            if isinstance(event, StageDone) and role == self.pipeline.final_role(record.route):
                self._finish_locked(record, record.finish_reason)

    def _push_audio(self, record: _Record, event: AudioSamples, since_arrival: float) -> None:
        start_s = record.audio_samples / event.sample_rate
        record.audio_samples += len(event.samples)
        record.sample_rate = event.sample_rate
        if record.first_audio_s is None:
            record.first_audio_s = since_arrival
        pcm = float_to_pcm16(np.asarray(event.samples)).astype("<i2").tobytes()
        self._push(record, AudioChunk(record.request.request_id, pcm, event.sample_rate, start_s,
                                      record.audio_samples / event.sample_rate))

    def _on_error(self, role: str, request_id: str, exc: Exception) -> None:
        with self._lock:
            record = self._records.get(request_id)
            if record is None or record.finished:
                return
            if self.workers[role].healthy():
                self._finish_locked(record, "error", f"{role} stage failed: {type(exc).__name__}: {exc}")
            else:  # the stage died under the request
                self._finish_locked(record, "error", f"stage {self._stage_names([role])} died: "
                                    f"{type(exc).__name__}: {exc}", StageUnavailableError.code)

    # Stage health (watcher thread) --------------------------------------------------------

    def _watch_stages(self) -> None:
        known_dead: list[str] = []
        while not self._stopping.wait(HEALTH_POLL_S):
            dead = self.unhealthy_stages()
            if dead != known_dead:
                logger.warning("unavailable stages: %s", self._stage_names(dead) or "none")
                known_dead = dead
            if dead:
                self._fail_all(dead)
                for role in dead:
                    self._release_dead_stage(role)

    def _fail_all(self, dead: list[str]) -> None:
        """End every in-flight request: a request may wait on a dead stage forever (an RPC
        to a dead vLLM engine never returns), wherever it is in the pipeline."""
        with self._lock:
            for record in list(self._records.values()):
                self._finish_locked(record, "error", f"stage {self._stage_names(dead)} died",
                                    StageUnavailableError.code)

    def _release_dead_stage(self, role: str) -> None:
        """Free what the dead stage still holds, then restart it if the deploy says so."""
        worker = self.workers[role]
        worker.drop_all()
        if isinstance(worker, AsyncEngineStage) and self.deploy.stage_by_role(role).restart_on_failure:
            worker.restart()

    # Ending requests ----------------------------------------------------------------------

    def _finish_locked(self, record: _Record, reason: str, error: str | None = None,
                       error_code: str | None = None) -> None:
        record.finished = True
        request_id = record.request.request_id
        self._records.pop(request_id, None)
        for worker in self.workers.values():  # also after a normal end: e.g. a talker that
            worker.drop(request_id)  # ended first leaves the thinker with nothing to do
        self._push(record, RequestFinished(
            request_id=request_id, finish_reason=reason, text=record.detokenizer.text,
            prompt_tokens=record.prompt_tokens,
            token_ids=tuple(record.detokenizer.token_ids),
            audio_duration_s=record.audio_samples / record.sample_rate if record.sample_rate else 0.0,
            time_to_first_audio_s=record.first_audio_s, stage_metrics=record.timer.metrics(), error=error,
            error_code=error_code))

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
