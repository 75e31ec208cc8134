"""Qwen3-Omni as a stage graph: thinker -> talker -> code2wav, and the connectors between.

The engine asks this object for the stage programs, for the first messages of a request,
and, for every event a stage emits, which messages go to which downstream stage. The
connector policy lives here:

* async_chunk on: the talker starts once the thinker has sampled its first token, and each
  further token the thinker feeds back reaches the talker at once; codec frames go to
  code2wav in chunks of `initial_codec_chunk_frames`, then `codec_chunk_frames`.
* async_chunk off: each connector holds everything until its upstream stage is done.
The final outputs are identical either way; only their timing differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_omni.config import CodecChunking, DeployConfig, SamplingParams
from vllm_omni.models.qwen3_omni.checkpoint import Qwen3OmniCheckpoint
from vllm_omni.models.qwen3_omni.prompt import ThinkerPrompt, render_prompt
from vllm_omni.models.qwen3_omni.stages import (
    Code2WavProgram,
    CodecChunk,
    CodecFrame,
    TalkerJob,
    TalkerProgram,
    ThinkerFinished,
    ThinkerJob,
    ThinkerPrefilled,
    ThinkerProgram,
    TrailingText,
)
from vllm_omni.models.qwen3_omni.talker_bridge import speaker_codec_id
from vllm_omni.models.qwen3_omni.vllm_talker import VllmTalkerDriver
from vllm_omni.models.qwen3_omni.vllm_thinker import VllmThinkerDriver
from vllm_omni.models.stage_api import AsyncStageDriver, StageDone, StageProgram, TextToken

Route = list[tuple[str, object]]


class CodecChunker:
    """Cuts a stream of codec frames into code2wav chunks: first `initial`, then `size`."""

    def __init__(self, chunking: CodecChunking, streaming: bool):
        self.initial, self.size = chunking.initial_codec_chunk_frames, chunking.codec_chunk_frames
        self.streaming = streaming
        self._frames: list[tuple[int, ...]] = []
        self._chunks = 0

    def _chunk(self) -> torch.Tensor:
        frames = torch.tensor(self._frames, dtype=torch.long).T if self._frames else \
            torch.zeros(16, 0, dtype=torch.long)
        self._frames = []
        self._chunks += 1
        return frames

    def add(self, codes: tuple[int, ...]) -> torch.Tensor | None:
        self._frames.append(codes)
        target = self.initial if self._chunks == 0 else self.size
        return self._chunk() if self.streaming and len(self._frames) >= target else None

    def flush(self) -> torch.Tensor:
        return self._chunk()


@dataclass
class RouteState:
    """Per-request connector state (guarded by the engine's routing lock)."""

    request_id: str
    wants_audio: bool
    speaker: str
    talker_sampling: SamplingParams
    chunker: CodecChunker
    async_chunk: bool
    talker_started: bool = False
    seen_first_token: bool = False
    held_for_talker: Route = field(default_factory=list)


class Qwen3OmniPipeline:
    ROLES = ("thinker", "talker", "code2wav")

    def __init__(self, checkpoint: Qwen3OmniCheckpoint, deploy: DeployConfig,
                 code2wav_mode: str = "exact"):
        self.checkpoint = checkpoint
        self.deploy = deploy
        code2wav_id = deploy.stage_by_role("code2wav").stage_id
        connector = next((c for c in deploy.connectors if c.to_stage == code2wav_id and c.extra is not None), None)
        self.chunking = connector.extra if connector is not None else CodecChunking()
        self.code2wav_mode = code2wav_mode

    def make_programs(self) -> dict[str, StageProgram | AsyncStageDriver]:
        """Per role: a step program (torch backend) or an engine driver (vllm backend)."""
        thinker_stage = self.deploy.stage_by_role("thinker")
        thinker = VllmThinkerDriver(self.checkpoint, thinker_stage) if thinker_stage.backend == "vllm" \
            else ThinkerProgram(self.checkpoint)
        talker_stage = self.deploy.stage_by_role("talker")
        talker = VllmTalkerDriver(self.checkpoint, talker_stage) if talker_stage.backend == "vllm" \
            else TalkerProgram(self.checkpoint)
        return {"thinker": thinker,
                "talker": talker,
                "code2wav": Code2WavProgram(self.checkpoint, self.code2wav_mode,
                                            self.chunking.codec_left_context_frames)}

    def set_async_chunk(self, on: bool) -> None:
        """Switch the connector policy for requests started from now on (the stages are
        the same either way)."""
        self.deploy = self.deploy.model_copy(update={"async_chunk": on})

    @property
    def tokenizer(self):
        return self.checkpoint.tokenizer

    @property
    def max_model_len(self) -> int:
        configured = self.deploy.stage_by_role("thinker").engine_args.max_model_len
        model_limit = self.checkpoint.config.thinker_config.text_config.max_position_embeddings
        return min(configured or model_limit, model_limit)

    def render(self, messages: Sequence[dict[str, Any]], audio_features: Sequence[torch.Tensor]) -> ThinkerPrompt:
        return render_prompt(self.checkpoint.tokenizer, self.checkpoint.config, messages, audio_features)

    def check_speaker(self, speaker: str) -> None:
        speaker_codec_id(self.checkpoint.config, speaker)

    def final_role(self, state: RouteState) -> str:
        return "code2wav" if state.wants_audio else "thinker"

    def start(self, request_id: str, prompt: ThinkerPrompt, thinker_sampling: SamplingParams,
              talker_sampling: SamplingParams, speaker: str, wants_audio: bool) -> tuple[RouteState, Route]:
        state = RouteState(request_id=request_id, wants_audio=wants_audio, speaker=speaker,
                           talker_sampling=talker_sampling,
                           chunker=CodecChunker(self.chunking, streaming=self.deploy.async_chunk),
                           async_chunk=self.deploy.async_chunk)
        return state, [("thinker", ThinkerJob(prompt, thinker_sampling, report_prefill=wants_audio))]

    def route(self, state: RouteState, role: str, event: object) -> Route:
        if not state.wants_audio:
            return []
        if role == "thinker":
            return self._from_thinker(state, event)
        if role == "talker":
            return self._from_talker(state, event)
        return []

    def _from_thinker(self, state: RouteState, event: object) -> Route:
        out: Route = []
        if isinstance(event, ThinkerPrefilled):
            state.talker_started = True
            out.append(("talker", TalkerJob(event.input_ids, event.prefill, state.speaker,
                                            state.talker_sampling)))
        elif isinstance(event, TextToken):
            first, state.seen_first_token = not state.seen_first_token, True
            if event.fed and not first:  # the first token is part of the talker's prompt
                out.append(("talker", TrailingText((event.token_id,))))
        elif isinstance(event, StageDone):
            if not state.talker_started:  # nothing to speak: close the audio path at once
                return [("code2wav", CodecChunk(state.chunker.flush(), final=True))]
            out.append(("talker", ThinkerFinished()))
        if state.async_chunk:
            return out
        state.held_for_talker += out
        if isinstance(event, StageDone):
            released, state.held_for_talker = state.held_for_talker, []
            return released
        return []

    def _from_talker(self, state: RouteState, event: object) -> Route:
        if isinstance(event, CodecFrame):
            chunk = state.chunker.add(event.codes)
            return [] if chunk is None else [("code2wav", CodecChunk(chunk, final=False))]
        if isinstance(event, StageDone):
            return [("code2wav", CodecChunk(state.chunker.flush(), final=True))]
        return []
