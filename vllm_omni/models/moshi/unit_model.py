"""Moshi as a natively duplex unit model (docs/moshi.md, "Serving"): every 80 ms of the user's
audio is a unit, and every unit gets the model's frame, so the model listens and speaks at once.

On the wire (docs/realtime-api.md §13.7, "Moshi"): a frame whose text is padding and whose speech
is quiet is a listen; any other frame speaks (it starts the model's turn or continues it); a
turn ends after END_OF_TURN_FRAMES quiet frames in a row, the quiet frames of a pause inside it
carrying their audio. A forced listen makes the frame quiet in the model's own stream too.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import MoshiForConditionalGeneration

from vllm_omni.audio.pcm import MODEL_RATE, StreamingResampler, float_to_pcm16_bytes
from vllm_omni.config import DeployConfig
from vllm_omni.config.schema import StageConfig
from vllm_omni.engine.native_duplex import DuplexOpening, UnitDecision
from vllm_omni.models.checkpoint_dir import local_checkpoint_dir
from vllm_omni.models.moshi.frame_batcher import FrameBatcher
from vllm_omni.models.moshi.frame_loop import Frame, FrameLoop, Sampling, StreamState
from vllm_omni.models.moshi.opening_settings import SETTING_KEYS, scripted_frames
from vllm_omni.models.moshi.text import SILENT_TEXT_IDS, TextPieces

UNIT_MS = 80
UNIT_SAMPLES = MODEL_RATE * UNIT_MS // 1000  # input samples per frame
QUIET_RMS = 10 ** (-50 / 20)  # a frame's speech below -50 dBFS says nothing
END_OF_TURN_FRAMES = 10  # quiet frames that end the model's turn (800 ms)
DEFAULT_SLOTS = 8


def _sampling(stage: StageConfig) -> Sampling:
    params = stage.default_sampling_params
    return Sampling(temperature=params.temperature, top_k=max(params.top_k or 0, 0))


class MoshiUnitModel:
    """The loaded checkpoint (transformers' classes, `kmhf/hf-moshiko` layout). Every frame of
    every session runs on one compute thread, the due frames of all sessions as one batch; that
    thread's torch uses `torch_threads` (None: torch's default, one per core)."""

    unit_ms = first_unit_ms = UNIT_MS
    setting_keys = SETTING_KEYS
    needs_voice_prompt = False  # Moshi speaks in the voice it was trained on

    def __init__(self, loop: FrameLoop, text: TextPieces, torch_threads: int | None = None):
        self.loop, self.text = loop, text
        self.output_sample_rate = loop.sample_rate
        # OpenMP's thread count is per calling thread: this sets the compute thread's alone
        initializer = None if torch_threads is None else functools.partial(torch.set_num_threads, torch_threads)
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moshi", initializer=initializer)
        self.batcher = FrameBatcher(loop, self.compute)

    @classmethod
    def load(cls, model: str | Path, deploy: DeployConfig) -> MoshiUnitModel:
        """`model` with stage 0's (thinker: the temporal transformer) text sampling and cache slots
        (max_num_seqs: sessions at once), stage 1's (talker: the depth decoder) audio sampling and
        the deploy's `server_torch_threads` for the compute thread."""
        if deploy.session_mode != "duplex":
            raise ValueError("Moshi listens and speaks at once: serve it with session_mode: duplex")
        for stage in deploy.stages:
            if stage.backend != "torch" or stage.replicas != 1 or stage.nice:
                raise ValueError(f"stage {stage.stage_id} ({stage.role}): Moshi runs one torch replica of each "
                                 "stage (docs/moshi.md, \"Serving\")")
        thinker, talker = deploy.stage_by_role("thinker"), deploy.stage_by_role("talker")
        device = torch.device("cuda" if thinker.torch_device == "cuda" else "cpu", thinker.devices[0]
                              if thinker.torch_device == "cuda" else None)
        dtype = getattr(torch, thinker.engine_args.dtype or "float32")
        folder = local_checkpoint_dir(model)
        weights = MoshiForConditionalGeneration.from_pretrained(folder, dtype=dtype).to(device).eval()
        slots = thinker.engine_args.max_num_seqs or DEFAULT_SLOTS
        return cls(FrameLoop(weights, slots, _sampling(thinker), _sampling(talker)), TextPieces(folder),
                   deploy.server_torch_threads)

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        scripted_frames(settings)

    def check_update(self, settings: Mapping[str, Any]) -> None:
        """Nothing of Moshi's is fixed at opening."""

    async def open(self, opening: DuplexOpening) -> MoshiUnitSession:
        state = await asyncio.get_running_loop().run_in_executor(self.compute, self.loop.open, 0)
        return MoshiUnitSession(self, state, opening.wants_audio, scripted_frames(opening.settings))

    def shutdown(self) -> None:
        self.compute.shutdown(wait=False, cancel_futures=True)


class MoshiUnitSession:
    def __init__(self, model: MoshiUnitModel, state: StreamState, wants_audio: bool,
                 script: Sequence[str]):
        self.model, self.state, self.wants_audio, self.script = model, state, wants_audio, script
        self._resampler = StreamingResampler(MODEL_RATE, model.output_sample_rate)
        # the resampler holds back its filter's delay; that many leading zeros put each frame's
        # end right on its unit's end
        self._pending = np.zeros(self._resampler.delay, np.float32)
        self._received = 0
        self._frames = 0
        self._speaking = False
        self._quiet_run = 0
        self.closed = False

    async def append(self, samples: np.ndarray, frame_groups: Sequence[Sequence[bytes]],
                     force_listen: bool) -> list[UnitDecision]:
        """Every frame the samples close, each decided as it closes (images are not heard: Moshi
        has no vision)."""
        self._received += samples.size
        self._pending = np.concatenate([self._pending, self._resampler.process(samples)])
        frame_samples = self.model.loop.frame_samples
        decisions = []
        while self._pending.size >= frame_samples:
            frame, self._pending = self._pending[:frame_samples], self._pending[frame_samples:]
            scripted = self.script[self._frames] if self._frames < len(self.script) else None
            forced = force_listen or scripted == "listen"
            self._frames += 1
            decided = await self.model.batcher.step(self.state, torch.from_numpy(frame.copy()), forced)
            decisions.append(self._decision(decided, forced, scripted))
        return decisions

    def _decision(self, frame: Frame, forced: bool, scripted: str | None) -> UnitDecision:
        if forced:
            ended, self._speaking, self._quiet_run = self._speaking, False, 0
            return UnitDecision(spoke=False, end_of_turn=ended)
        audio = float_to_pcm16_bytes(frame.audio) if self.wants_audio else b""
        text = self.model.text.piece(frame.text_token)
        if scripted is not None:  # "speak" or "speak_end": the frame speaks, whatever it holds
            ended = scripted == "speak_end"
            self._speaking, self._quiet_run = not ended, 0
            return UnitDecision(spoke=True, text=text, audio=audio, end_of_turn=ended,
                                token_times_s=(frame.chosen_at_s,))
        quiet = frame.text_token in SILENT_TEXT_IDS and float(np.sqrt(np.mean(frame.audio ** 2))) < QUIET_RMS
        if not quiet:
            self._speaking, self._quiet_run = True, 0
            return UnitDecision(spoke=True, text=text, audio=audio, token_times_s=(frame.chosen_at_s,))
        if not self._speaking:
            return UnitDecision(spoke=False)
        self._quiet_run += 1
        ended = self._quiet_run >= END_OF_TURN_FRAMES
        if ended:
            self._speaking, self._quiet_run = False, 0
        return UnitDecision(spoke=True, audio=audio, end_of_turn=ended)

    def samples_to_boundary(self) -> int:
        return UNIT_SAMPLES - self._received % UNIT_SAMPLES

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await asyncio.get_running_loop().run_in_executor(self.model.compute, self.model.loop.close, self.state)
