"""MiniCPM-o 4.5 as a natively duplex model (docs/minicpmo.md, "Serving"): the duplex thinker
decides each unit, the talker turns a speaking unit's tokens into codes, token2wav the codes
into 24 kHz speech in the voice of the session's prompt. One `MiniCPMOUnitSession` per
conversation holds all three's state.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from vllm_omni.audio.pcm import MODEL_RATE, float_to_pcm16_bytes
from vllm_omni.config import DeployConfig
from vllm_omni.engine.backends.vllm.engine_driver import engine_kwargs, stage_devices
from vllm_omni.engine.native_duplex import DuplexOpening, UnitDecision
from vllm_omni.models.minicpmo.audio_encoder import AudioEncoderState
from vllm_omni.models.minicpmo.config import register_hf_classes
from vllm_omni.models.minicpmo.duplex_loop import DEFAULT_SYSTEM_PROMPT, SessionState
from vllm_omni.models.minicpmo.mel_stream import UNIT_SAMPLES, StreamingMel, unit_close_samples
from vllm_omni.models.minicpmo.opening_settings import SETTING_KEYS, OpeningSettings, check_update, opening_settings
from vllm_omni.models.minicpmo.talker import TalkerSampling
from vllm_omni.models.minicpmo.token2wav import Token2Wav
from vllm_omni.models.minicpmo.token2wav_stream import Token2WavStream
from vllm_omni.models.minicpmo.tokenizer import register_tokenizer
from vllm_omni.models.minicpmo.torch_thinker import TorchDuplexThinker
from vllm_omni.models.minicpmo.unit_decoder import UnitSampling

OUTPUT_SAMPLE_RATE = 24000
VOICE_ROW_SAMPLES = 1600  # one LLM row per 100 ms of the voice prompt
T = TypeVar("T")

if TYPE_CHECKING:
    from vllm_omni.models.minicpmo.vllm_thinker import VllmDuplexThinker


class MiniCPMOUnitModel:
    """The loaded checkpoint; `open` starts a conversation. The thinker runs on torch or on a
    vLLM engine (stage 0's backend). Torch work runs on two threads, each in order: the
    thinker's (encoders, the torch LLM) and the talker on one, token2wav on the other, so one
    session's speech is vocoded while the next unit is decided."""

    output_sample_rate = OUTPUT_SAMPLE_RATE
    unit_ms = UNIT_SAMPLES * 1000 // MODEL_RATE
    first_unit_ms = unit_close_samples(0) * 1000 // MODEL_RATE  # 30 ms longer (mel_stream.py)
    setting_keys = SETTING_KEYS
    needs_voice_prompt = True  # token2wav speaks in the voice of ref_audio

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        opening_settings(settings)

    def check_update(self, settings: Mapping[str, Any]) -> None:
        check_update(settings)

    def __init__(self, thinker: TorchDuplexThinker | VllmDuplexThinker, vocoder: Token2Wav,
                 compute: ThreadPoolExecutor):
        self.thinker, self.vocoder, self.compute = thinker, vocoder, compute
        self.vocoding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minicpmo-token2wav")

    @classmethod
    def load(cls, model: str | Path, deploy: DeployConfig) -> MiniCPMOUnitModel:
        """`model` loaded with the deploy's sampling (stage 0: the thinker's per-unit
        decoding, stage 1: the talker's) and stage 0's backend."""
        if deploy.session_mode != "duplex":
            raise ValueError("MiniCPM-o decides its own turns: serve it with session_mode: duplex")
        register_hf_classes()
        register_tokenizer()
        for stage in deploy.stages:
            if stage.replicas != 1:
                raise ValueError(f"stage {stage.stage_id} ({stage.role}): MiniCPM-o runs one replica of each stage "
                                 "(a session's state lives in all three); serve more sessions with more servers")
            if stage.nice:
                raise ValueError(f"stage {stage.stage_id} ({stage.role}): MiniCPM-o's engine does not take nice "
                                 "(its vLLM thinker runs vLLM's own executor)")
            if stage.backend != "torch" and stage.role != "thinker":
                raise ValueError(f"stage {stage.stage_id} ({stage.role}): MiniCPM-o's talker and token2wav run "
                                 "on backend 'torch' (docs/minicpmo.md, \"Serving\")")
        stage = deploy.stage_by_role("thinker")
        thinker, talker = stage.default_sampling_params, deploy.stage_by_role("talker").default_sampling_params
        unit_sampling = UnitSampling(temperature=thinker.temperature, top_k=thinker.top_k or UnitSampling.top_k,
                                     top_p=thinker.top_p, repetition_penalty=thinker.repetition_penalty,
                                     max_positions=thinker.max_tokens)
        talker_sampling = TalkerSampling(temperature=talker.temperature, repetition_penalty=talker.repetition_penalty)
        compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minicpmo")
        if stage.backend == "vllm":
            from vllm_omni.models.minicpmo.vllm_thinker import VllmDuplexThinker  # vLLM loads only when used

            with stage_devices(stage):
                llm = VllmDuplexThinker(model, unit_sampling, talker_sampling, compute=compute,
                                        **engine_kwargs(stage, str(model)))
        else:
            llm = TorchDuplexThinker(model, unit_sampling, talker_sampling)
        return cls(llm, Token2Wav.from_checkpoint(model), compute)

    async def open(self, opening: DuplexOpening) -> MiniCPMOUnitSession:
        settings = opening_settings(opening.settings)
        voice = None if opening.voice_prompt is None else await self.run(self.voice_rows, opening.voice_prompt)
        session = await self.thinker_call("start", opening.instructions or DEFAULT_SYSTEM_PROMPT, voice,
                                          generator=torch.Generator().manual_seed(0),
                                          user_text=opening.initial_user_text, window=settings.window)
        speech = None
        if opening.wants_audio:
            if opening.voice_prompt is None:
                raise ValueError("speech needs a voice prompt (ref_audio)")
            voice = opening.voice_prompt
            speech = await self.vocode(lambda: self.vocoder.stream(self.vocoder.voice(voice, MODEL_RATE)))
        return MiniCPMOUnitSession(self, session, settings, speech)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the compute thread."""
        return await asyncio.get_running_loop().run_in_executor(self.compute, fn, *args)

    async def vocode(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the token2wav thread."""
        return await asyncio.get_running_loop().run_in_executor(self.vocoding, fn, *args)

    async def thinker_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A thinker method: the torch one on the compute thread, the vLLM one (async) as it is."""
        if isinstance(self.thinker, TorchDuplexThinker):
            return await self.run(functools.partial(getattr(self.thinker, method), *args, **kwargs))
        return await getattr(self.thinker, method)(*args, **kwargs)

    def shutdown(self) -> None:
        if not isinstance(self.thinker, TorchDuplexThinker):
            self.thinker.shutdown()
        self.compute.shutdown(wait=False, cancel_futures=True)
        self.vocoding.shutdown(wait=False, cancel_futures=True)

    def voice_rows(self, samples: np.ndarray) -> torch.Tensor:
        """The voice prompt's LLM rows, one per whole 100 ms: the prompt is encoded on the unit
        grid from a fresh encoder state, zero-padded to the unit that holds its end."""
        rows_wanted = samples.size // VOICE_ROW_SAMPLES
        if rows_wanted == 0:
            raise ValueError(f"the voice prompt is {samples.size / 16:.0f} ms long; it needs at least 100 ms")
        units = 1
        while unit_close_samples(units - 1) < samples.size:
            units += 1
        padded = np.zeros(unit_close_samples(units - 1), np.float32)
        padded[:samples.size] = samples
        mel, state = StreamingMel(), AudioEncoderState()
        rows = [self.thinker.encoder.encode_unit(torch.from_numpy(chunk), state, first=index == 0)
                for index, chunk in enumerate(mel.append(padded))]
        return torch.cat(rows)[:rows_wanted]


class MiniCPMOUnitSession:
    def __init__(self, model: MiniCPMOUnitModel, session: SessionState, settings: OpeningSettings,
                 speech: Token2WavStream | None):
        self.model, self.session, self.speech = model, session, speech
        self.force_listen_count = settings.force_listen_count
        self.test_decisions = settings.test_decisions
        self.units_in_turn = 0  # units decided since the model's last turn ended
        ids = model.thinker.ids
        self.markers = {ids.speak, ids.turn_eos, ids.tts_bos, *ids.terminators}  # tokens that say nothing

    async def append(self, samples: np.ndarray, frame_groups: Sequence[Sequence[bytes]],
                     force_listen: bool) -> list[UnitDecision]:
        """Unit by unit (the samples are cut at unit ends), so each unit gets its own forcing; the
        groups queue in order for the units that close from now on (models/minicpmo/vision.py)."""
        decisions = []
        self.session.frame_groups.extend(list(group) for group in frame_groups if group)
        while samples.size:
            piece, samples = samples[:self.samples_to_boundary()], samples[self.samples_to_boundary():]
            unit = self.session.units
            forced = force_listen or self.units_in_turn < self.force_listen_count
            script = self.test_decisions[unit] if unit < len(self.test_decisions) else None
            results = await self.model.thinker_call("append_audio", self.session, piece, forced_listen=forced,
                                                    script=script)
            for result in results:
                self.units_in_turn = 0 if result.ended_turn else self.units_in_turn + 1
                said = any(token not in self.markers for token in result.tokens)
                audio = await self.model.vocode(self._speech, result.codes, result.ended_turn)
                decisions.append(UnitDecision(spoke=said, text=result.text, audio=audio,
                                              end_of_turn=result.ended_turn,
                                              token_times_s=tuple(result.token_times_s)))
        return decisions

    def samples_to_boundary(self) -> int:
        return unit_close_samples(self.session.units) - self.session.mel.received

    async def close(self) -> None:
        await self.model.thinker_call("close", self.session)

    def _speech(self, codes: list[int], ends_turn: bool) -> bytes:
        """A unit's codes as PCM16: vocoded at once (each unit ends with a terminator), the
        turn's remainder too when the turn ends."""
        if self.speech is None or not codes:
            return b""
        samples = self.speech.push(codes, flush=True)
        if ends_turn:
            samples = np.concatenate([samples, self.speech.finish()])
        return float_to_pcm16_bytes(samples)
