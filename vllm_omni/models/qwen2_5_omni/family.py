"""Qwen2.5-Omni as a model family (`engine/family.py`): thinker -> talker -> token2wav.

The stage roles are Qwen3-Omni's (the token2wav stage has role `code2wav`), and so is most of
the family: the chat template, tools, images, audio input and the connector policy (async_chunk
on: the talker starts with the thinker's first answer row and takes each further row at once;
off: each connector holds everything until its upstream stage is done). What differs is what
crosses the connectors (messages.py): the talker reads the thinker's hidden rows, not its token
ids, and token2wav is a DiT over windows of codes (torch_backend/token2wav.py). With
async_chunk off token2wav solves the whole answer at once, exactly as transformers does; with
it on, the audio streams within a measured bound of that (docs/qwen2_5_omni.md).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm_omni.config import DeployConfig, SamplingParams, StageConfig
from vllm_omni.engine.backends.torch_device import stage_torch_device
from vllm_omni.engine.family import Route
from vllm_omni.engine.stage_api import AsyncStageDriver, StageDone, StageProgram, TextToken
from vllm_omni.models.qwen2_5_omni.checkpoint import Voice, load_checkpoint
from vllm_omni.models.qwen2_5_omni.messages import (
    SAMPLE_RATE,
    ReplyRow,
    TalkerJob,
    ThinkerPrompted,
    Token2WavJob,
)
from vllm_omni.models.qwen2_5_omni.prompt import render_prompt
from vllm_omni.models.qwen2_5_omni.torch_backend.programs import (
    BatchedToken2WavProgram,
    TalkerProgram,
    ThinkerProgram,
    Token2WavProgram,
)
from vllm_omni.models.qwen2_5_omni.torch_backend.token2wav import Windows
from vllm_omni.models.qwen3_omni.family import CodecChunker, Qwen3OmniFamily
from vllm_omni.models.qwen3_omni.images import ThinkerImage
from vllm_omni.models.qwen3_omni.messages import CodecChunk, CodecFrame, ThinkerFinished, ThinkerJob
from vllm_omni.models.qwen3_omni.prompt import ThinkerPrompt

DEFAULT_SPEAKER = "chelsie"  # transformers' default voice
# Mel frames of BigVGAN context on each side of a streamed piece: 16 leave a piece within 0.1 LSB
# of the whole mel's vocoding (12: 9 LSB, 8: 100 LSB), docs/qwen2_5_omni.md.
VOCODER_CONTEXT_FRAMES = 16


def _load_stage_program(model: str, deploy: dict[str, Any], stage: dict[str, Any]) -> StageProgram:
    """One stage replica's program, built in the process that runs it (a Ray actor)."""
    family = Qwen25OmniFamily.load(model, DeployConfig.model_validate(deploy))
    return family.make_program(StageConfig.model_validate(stage))


@dataclass
class RouteState:
    """Per-request connector state (guarded by the engine's routing lock)."""

    request_id: str
    wants_audio: bool
    voice: Voice
    talker_sampling: SamplingParams
    seed: int  # of the DiT's noise
    chunker: CodecChunker
    async_chunk: bool
    prompted: ThinkerPrompted | None = None
    talker_started: bool = False
    token2wav_started: bool = False
    calling_tool: bool = False  # the thinker began a tool call: what follows is not spoken
    held_for_talker: Route = field(default_factory=list)


class Qwen25OmniFamily(Qwen3OmniFamily):
    name = "qwen2_5_omni"
    output_sample_rate = SAMPLE_RATE

    @classmethod
    def load(cls, model: str | Path, deploy: DeployConfig, **_: Any) -> Qwen25OmniFamily:
        for stage in deploy.stages:
            if stage.backend != "torch" and stage.role != "thinker":
                raise ValueError(f"stage {stage.stage_id} ({stage.role}): {cls.name} serves its thinker on vLLM "
                                 "(backend: vllm or torch); its talker and token2wav run on the torch backend "
                                 "(backend: torch)")
        dtype = deploy.stage_by_role("thinker").engine_args.dtype or "float32"
        return cls(load_checkpoint(model, dtype=dtype), deploy)

    def make_program(self, stage: StageConfig) -> StageProgram | AsyncStageDriver:
        if stage.backend == "vllm":  # the thinker (load): vLLM is imported only then
            from vllm_omni.models.qwen2_5_omni.vllm_backend.thinker import Qwen25VllmThinkerDriver

            return Qwen25VllmThinkerDriver(self.checkpoint, stage)
        module = self.checkpoint.token2wav if stage.role == "code2wav" else getattr(self.checkpoint, stage.role)
        module.to(stage_torch_device(stage))
        if stage.role == "thinker":
            return ThinkerProgram(self.checkpoint)
        if stage.role == "talker":
            return TalkerProgram(self.checkpoint)
        chunking = self.chunking
        program = BatchedToken2WavProgram if stage.batch_requests else Token2WavProgram
        return program(self.checkpoint, Windows(
            first=chunking.initial_codec_chunk_frames, most=chunking.codec_chunk_frames,
            left_context=chunking.codec_left_context_frames, vocoder_context_frames=VOCODER_CONTEXT_FRAMES))

    def remote_program(self, stage: StageConfig) -> Callable[[], StageProgram | AsyncStageDriver]:
        return functools.partial(_load_stage_program, self.checkpoint.path, self.deploy.model_dump(mode="json"),
                                 stage.model_dump(mode="json"))

    def render(self, messages: Sequence[dict[str, Any]], audio_features: Sequence[torch.Tensor],
               tools: Sequence[dict[str, Any]] = (), call_tool: bool = False,
               images: Sequence[ThinkerImage] = ()) -> ThinkerPrompt:
        return render_prompt(self.checkpoint.tokenizer, self.checkpoint.config, self.checkpoint.im_end_id, messages,
                             audio_features, tools, call_tool, images)

    @property
    def speakers(self) -> list[str]:
        return sorted(self.checkpoint.voices)

    @property
    def default_speaker(self) -> str | None:
        return DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else next(iter(self.speakers), None)

    def check_speaker(self, speaker: str) -> None:
        if speaker.lower() not in self.checkpoint.voices:
            raise ValueError(f"unknown voice {speaker!r}; this model's voices: {', '.join(self.speakers)}")

    def start(self, request_id: str, prompt: ThinkerPrompt, sampling: dict[str, SamplingParams],
              speaker: str | None, wants_audio: bool,
              forced_tools: Sequence[dict[str, Any]] | None = None) -> tuple[RouteState, Route]:
        state, route = super().start(request_id, prompt, sampling, speaker, wants_audio, forced_tools)
        job: ThinkerJob = route[0][1]
        seed = sampling["code2wav"].seed
        return RouteState(request_id=request_id, wants_audio=wants_audio,
                          voice=self.checkpoint.voices[(speaker or self.default_speaker or "").lower()],
                          talker_sampling=state.talker_sampling,
                          seed=random.SystemRandom().getrandbits(63) if seed is None else seed,
                          chunker=state.chunker, async_chunk=state.async_chunk), [("thinker", job)]

    def _from_thinker(self, state: RouteState, event: object) -> Route:
        out: Route = []
        if isinstance(event, ThinkerPrompted):
            state.prompted = event
        elif isinstance(event, TextToken):
            state.calling_tool = state.calling_tool or event.token_id == self.tool_call_open_id
        elif isinstance(event, ReplyRow) and not state.calling_tool:
            if state.talker_started:
                out.append(("talker", event))
            elif state.prompted is not None:  # the first answer token's row completes the talker's prompt
                state.talker_started = True
                prompted = state.prompted
                out.append(("talker", TalkerJob(prompted.prompt, prompted.rows, prompted.first_token, event.row,
                                                state.voice, state.talker_sampling)))
        elif isinstance(event, StageDone) and state.talker_started:
            out.append(("talker", ThinkerFinished()))
        return self._connector_policy(state, event, out)

    def _from_talker(self, state: RouteState, event: object) -> Route:
        out: Route = []
        if not state.token2wav_started:
            state.token2wav_started = True
            out.append(("code2wav", Token2WavJob(state.voice, state.seed, one_shot=not state.async_chunk)))
        if isinstance(event, CodecFrame):
            chunk = state.chunker.add(event.codes)
            if chunk is not None:
                out.append(("code2wav", CodecChunk(chunk, final=False)))
        elif isinstance(event, StageDone):
            out.append(("code2wav", CodecChunk(state.chunker.flush(), final=True)))
        return out
