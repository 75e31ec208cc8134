"""Qwen3-Omni as a model family (`engine/family.py`): thinker -> talker -> code2wav.

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

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm_omni.config import CodecChunking, DeployConfig, SamplingParams, StageConfig
from vllm_omni.engine.backends.torch_device import stage_torch_device
from vllm_omni.engine.family import Route
from vllm_omni.engine.request import AudioInputStream, RequestError
from vllm_omni.engine.stage_api import AsyncStageDriver, StageDone, StageProgram, TextToken
from vllm_omni.models.qwen3_omni.checkpoint import Qwen3OmniCheckpoint, load_checkpoint
from vllm_omni.models.qwen3_omni.images import ThinkerImage, decode_image
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
from vllm_omni.models.qwen3_omni.prompt import ThinkerPrompt, render_prompt
from vllm_omni.models.qwen3_omni.talker_bridge import speaker_codec_id
from vllm_omni.models.qwen3_omni.tool_calls import CALL_OPEN, QwenToolCallParser, call_schema
from vllm_omni.models.qwen3_omni.torch_backend.programs import (
    BatchedCode2WavProgram,
    Code2WavProgram,
    TalkerProgram,
    ThinkerProgram,
)

DEFAULT_SPEAKER = "ethan"


def _load_stage_program(model: str, deploy: dict[str, Any], stage: dict[str, Any],
                        code2wav_mode: str) -> StageProgram | AsyncStageDriver:
    """One stage replica's program, built in the process that runs it (a Ray actor)."""
    family = Qwen3OmniFamily.load(model, DeployConfig.model_validate(deploy), code2wav_mode=code2wav_mode)
    return family.make_program(StageConfig.model_validate(stage))



class CodecChunker:
    """Cuts a stream of codec frames into code2wav chunks: first `initial`, then `size`; with
    `ramp`, the chunks in between grow: each half as long as all before it together, so a
    short first chunk (fast first audio) is followed by chunks that take half as long to
    make as the audio already sent lasts, even when the talker is slowed by load."""

    def __init__(self, chunking: CodecChunking, streaming: bool):
        self.initial, self.size = chunking.initial_codec_chunk_frames, chunking.codec_chunk_frames
        self.ramp = chunking.ramp_codec_chunks
        self.streaming = streaming
        self._frames: list[tuple[int, ...]] = []
        self._sent = 0  # frames in the chunks cut so far

    def _chunk(self) -> torch.Tensor:
        frames = torch.tensor(self._frames, dtype=torch.long).T if self._frames else \
            torch.zeros(16, 0, dtype=torch.long)
        self._sent += len(self._frames)
        self._frames = []
        return frames

    def _target(self) -> int:
        if self._sent == 0:
            return self.initial
        return min(self.size, max(self.initial, self._sent // 2)) if self.ramp else self.size

    def add(self, codes: tuple[int, ...]) -> torch.Tensor | None:
        self._frames.append(codes)
        return self._chunk() if self.streaming and len(self._frames) >= self._target() else None

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
    calling_tool: bool = False  # the thinker began a tool call: what follows is not spoken
    held_for_talker: Route = field(default_factory=list)


class Qwen3OmniFamily:
    name = "qwen3_omni"
    roles = ("thinker", "talker", "code2wav")
    edges = (("thinker", "talker"), ("talker", "code2wav"))
    text_role = "thinker"
    audio_token_role = "talker"
    output_sample_rate = SAMPLE_RATE

    def __init__(self, checkpoint: Qwen3OmniCheckpoint, deploy: DeployConfig,
                 code2wav_mode: str = "exact"):
        self.checkpoint = checkpoint
        self.deploy = deploy
        code2wav_id = deploy.stage_by_role("code2wav").stage_id
        connector = next((c for c in deploy.connectors if c.to_stage == code2wav_id and c.extra is not None), None)
        self.chunking = connector.extra if connector is not None else CodecChunking()
        self.code2wav_mode = code2wav_mode
        # looked up once: the router compares every thinker token with it
        self.tool_call_open_id: int = checkpoint.tokenizer.convert_tokens_to_ids(CALL_OPEN)

    @classmethod
    def load(cls, model: str | Path, deploy: DeployConfig, code2wav_mode: str = "exact") -> Qwen3OmniFamily:
        """Load the checkpoint for `deploy`: with both autoregressive stages in vLLM engines, this
        process runs only code2wav and the bridge, so only their weights are read."""
        for stage in deploy.stages:
            if stage.backend == "vllm" and stage.role not in ("thinker", "talker"):
                raise ValueError(f"stage {stage.stage_id} ({stage.role}): backend 'vllm' serves the "
                                 "autoregressive stages (thinker, talker); use backend: torch")
        dtype = deploy.stage_by_role("thinker").engine_args.dtype or "float32"
        engines_hold_weights = all(deploy.stage_by_role(role).backend == "vllm" for role in ("thinker", "talker"))
        checkpoint = load_checkpoint(model, dtype=dtype, bridge_only=engines_hold_weights)
        return cls(checkpoint, deploy, code2wav_mode=code2wav_mode)

    def make_program(self, stage: StageConfig) -> StageProgram | AsyncStageDriver:
        """One replica of a stage: vLLM replicas are engines of their own (vLLM is imported only
        then, so torch-only deploys run without it); torch replicas are programs over the
        weights this process loaded once, the stage's module moved to its `torch_device`."""
        if stage.backend == "vllm":
            if stage.role == "thinker":
                from vllm_omni.models.qwen3_omni.vllm_backend.thinker import VllmThinkerDriver

                return VllmThinkerDriver(self.checkpoint, stage)
            from vllm_omni.models.qwen3_omni.vllm_backend.talker import VllmTalkerDriver

            return VllmTalkerDriver(self.checkpoint, stage)
        getattr(self.checkpoint, stage.role).to(stage_torch_device(stage))
        if stage.role == "thinker":
            return ThinkerProgram(self.checkpoint)
        if stage.role == "talker":
            return TalkerProgram(self.checkpoint)
        program = BatchedCode2WavProgram if stage.batch_requests else Code2WavProgram
        return program(self.checkpoint, self.code2wav_mode, self.chunking.codec_left_context_frames)

    def remote_program(self, stage: StageConfig) -> Callable[[], StageProgram | AsyncStageDriver]:
        return functools.partial(_load_stage_program, self.checkpoint.path, self.deploy.model_dump(mode="json"),
                                 stage.model_dump(mode="json"), self.code2wav_mode)

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

    def render(self, messages: Sequence[dict[str, Any]], audio_features: Sequence[torch.Tensor],
               tools: Sequence[dict[str, Any]] = (), call_tool: bool = False,
               images: Sequence[ThinkerImage] = ()) -> ThinkerPrompt:
        return render_prompt(self.checkpoint.tokenizer, self.checkpoint.config, messages, audio_features, tools,
                             call_tool, images)

    def decode_image(self, data: bytes) -> ThinkerImage:
        if self.checkpoint.image_processor is None:
            raise ValueError(f"the checkpoint {self.checkpoint.path} has no image processor, so it takes no images")
        return decode_image(self.checkpoint.image_processor, data)

    def tool_call_parser(self, forced: bool) -> QwenToolCallParser:
        return QwenToolCallParser(self.checkpoint.tokenizer, forced)

    @property
    def speakers(self) -> list[str]:
        return sorted(self.checkpoint.config.talker_config.speaker_id)

    @property
    def default_speaker(self) -> str | None:
        return DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else next(iter(self.speakers), None)

    def audio_stream(self) -> AudioInputStream:
        return AudioInputStream()  # Whisper-style 128-bin log-mel at 16 kHz, as the audio encoder takes

    def check_speaker(self, speaker: str) -> None:
        speaker_codec_id(self.checkpoint.config, speaker)

    def final_role(self, state: RouteState) -> str:
        """code2wav ends a spoken answer; the thinker ends a text answer, and a spoken one whose
        talker never started (the thinker ended before its first token: nothing to speak)."""
        return "code2wav" if state.wants_audio and state.talker_started else "thinker"

    def start(self, request_id: str, prompt: ThinkerPrompt, sampling: dict[str, SamplingParams],
              speaker: str | None, wants_audio: bool,
              forced_tools: Sequence[dict[str, Any]] | None = None) -> tuple[RouteState, Route]:
        """A forced tool call is the thinker's JSON answer constrained by vLLM's structured outputs;
        nothing is spoken for it (the talker never starts)."""
        thinker_sampling = sampling["thinker"]
        schema = None
        if forced_tools is not None:
            if self.deploy.stage_by_role("thinker").backend != "vllm":
                raise RequestError("tool_choice: forcing a tool call constrains the answer with vLLM's structured "
                                   "outputs; the thinker stage runs on the torch backend (use backend: vllm)")
            schema = call_schema(forced_tools)
        state = RouteState(request_id=request_id, wants_audio=wants_audio, speaker=speaker or DEFAULT_SPEAKER,
                           talker_sampling=sampling["talker"],
                           chunker=CodecChunker(self.chunking, streaming=self.deploy.async_chunk),
                           async_chunk=self.deploy.async_chunk)
        return state, [("thinker", ThinkerJob(prompt, thinker_sampling, report_prefill=wants_audio and schema is None,
                                              json_schema=schema))]

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
            out.append(("talker", TalkerJob(event.prompt, event.prefill, state.speaker,
                                            state.talker_sampling)))
        elif isinstance(event, TextToken):
            first, state.seen_first_token = not state.seen_first_token, True
            state.calling_tool = state.calling_tool or event.token_id == self.tool_call_open_id
            if event.fed and not first and not state.calling_tool:  # the first token is in the talker's prompt
                out.append(("talker", TrailingText((event.token_id,))))
        elif isinstance(event, StageDone):
            if not state.talker_started:  # nothing to speak: the request ends with the thinker
                return []
            out.append(("talker", ThinkerFinished()))
        return self._connector_policy(state, event, out)

    @staticmethod
    def _connector_policy(state: RouteState, event: object, out: Route) -> Route:
        """`out` at once with async_chunk on; else held until the thinker is done."""
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
