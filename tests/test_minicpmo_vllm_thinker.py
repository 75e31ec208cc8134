"""MiniCPM-o's duplex thinker with its LLM on a real vLLM engine (tiny checkpoint, CPU, float32),
against the torch backend on the same weights: the same logits at every step, the same
units, sessions that do not disturb each other, and a context vLLM keeps across units."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
import torch
from PIL import Image

from tests.conftest import read_fixture_pcm
from vllm_omni.models.minicpmo.audio_encoder import AudioEncoderState
from vllm_omni.models.minicpmo.duplex_loop import Feed, Step, UnitResult
from vllm_omni.models.minicpmo.mel_stream import StreamingMel, unit_close_samples
from vllm_omni.models.minicpmo.opening_settings import ContextWindow
from vllm_omni.models.minicpmo.talker import TalkerSampling
from vllm_omni.models.minicpmo.torch_thinker import TorchDuplexThinker
from vllm_omni.models.minicpmo.unit_decoder import ScriptedDecision, UnitSampling
from vllm_omni.models.minicpmo.vllm_thinker import VllmDuplexSession, VllmDuplexThinker

pytestmark = pytest.mark.asyncio(loop_scope="session")  # the engine's output handler lives in one loop

SAMPLING = UnitSampling(temperature=0.0)
TALKER_SAMPLING = TalkerSampling(temperature=0.0, repetition_penalty=1.0)
SCRIPT: list[ScriptedDecision] = ["listen", "speak", "speak_end"]
TOLERANCE = 1e-4  # float32, different kernels and batch shapes


@pytest.fixture(scope="module")
def torch_thinker(minicpmo_checkpoint: Path) -> TorchDuplexThinker:
    return TorchDuplexThinker(minicpmo_checkpoint, SAMPLING, TALKER_SAMPLING)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_thinker(minicpmo_checkpoint: Path):
    started = time.perf_counter()
    thinker = VllmDuplexThinker(minicpmo_checkpoint, SAMPLING, TALKER_SAMPLING, enforce_eager=True,
                                max_model_len=4096, seed=0)
    print(f"\nvLLM engine started in {time.perf_counter() - started:.1f} s")
    yield thinker
    thinker.shutdown()


def speech(name: str, units: int) -> np.ndarray:
    return read_fixture_pcm(name)[: unit_close_samples(units - 1)]


def unit_audio(samples: np.ndarray, unit: int) -> np.ndarray:
    return samples[unit_close_samples(unit - 1) if unit else 0: unit_close_samples(unit)]


def voice_rows(thinker: TorchDuplexThinker) -> torch.Tensor:
    """A voice prompt's rows: one unit of speech through a fresh encoder."""
    (chunk,) = StreamingMel().append(speech("speech_en_single.wav", 1))
    return thinker.encoder.encode_unit(torch.from_numpy(chunk), AudioEncoderState(), first=True)


def frame() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (640, 480), (20, 120, 200)).save(out, "JPEG")
    return out.getvalue()


def summary(units: list[UnitResult]) -> list[tuple[list[int], str, list[int], bool]]:
    return [(unit.tokens, unit.text, unit.codes, unit.ended_turn) for unit in units]


class StepRecorder:
    """Keeps every step a thinker's backend returns (shadowing its `_forward` on the instance)."""

    def __init__(self, thinker: TorchDuplexThinker | VllmDuplexThinker):
        self.thinker, self.steps = thinker, []
        forward = thinker._forward

        def record(step: Step | None, feed: Feed) -> Step | None:
            if feed.wants_step:
                self.steps.append(step)
            return step

        if asyncio.iscoroutinefunction(forward):
            async def recorded(session, feed):
                return record(await forward(session, feed), feed)
        else:
            def recorded(session, feed):
                return record(forward(session, feed), feed)
        thinker._forward = recorded

    def __enter__(self) -> list[Step]:
        return self.steps

    def __exit__(self, *exc: object) -> None:
        del self.thinker._forward


def torch_scenario(thinker: TorchDuplexThinker, voice: torch.Tensor):
    """Voice prompt, a frame on the first unit, then listen, speak, speak_end."""
    audio = speech("speech_en_long.wav", len(SCRIPT))
    session = thinker.start(voice_rows=voice)
    units = [thinker.append_audio(session, unit_audio(audio, u), frames=[frame()] if u == 0 else None, script=s)
             for u, s in enumerate(SCRIPT)]
    return session, [unit for appended in units for unit in appended]


async def vllm_scenario(thinker: VllmDuplexThinker, voice: torch.Tensor, timings: list[float] | None = None):
    audio = speech("speech_en_long.wav", len(SCRIPT))
    session = await thinker.start(voice_rows=voice)
    units = []
    for u, script in enumerate(SCRIPT):
        started = time.perf_counter()
        units += await thinker.append_audio(session, unit_audio(audio, u), frames=[frame()] if u == 0 else None,
                                            script=script)
        if timings is not None:
            timings.append(time.perf_counter() - started)
    return session, units


@pytest.fixture(scope="module")
def torch_run(torch_thinker: TorchDuplexThinker):
    with StepRecorder(torch_thinker) as steps:
        session, units = torch_scenario(torch_thinker, voice_rows(torch_thinker))
    return session, units, steps


async def test_every_step_has_the_torch_logits_and_hidden_state(vllm_thinker: VllmDuplexThinker,
                                                                 torch_thinker: TorchDuplexThinker, torch_run) -> None:
    _, torch_units, torch_steps = torch_run
    timings: list[float] = []
    with StepRecorder(vllm_thinker) as steps:
        session, units = await vllm_scenario(vllm_thinker, voice_rows(torch_thinker), timings)
    await vllm_thinker.close(session)
    assert len(steps) == len(torch_steps) == sum(len(unit.tokens) for unit in torch_units)
    logits = max(float((ours.logits - ref.logits).abs().max()) for ours, ref in zip(steps, torch_steps, strict=True))
    hidden = max(float((ours.hidden - ref.hidden).abs().max()) for ours, ref in zip(steps, torch_steps, strict=True))
    decisions = [0] + list(np.cumsum([len(unit.tokens) for unit in torch_units[:-1]]))
    decision = max(float((steps[i].logits - torch_steps[i].logits).abs().max()) for i in decisions)
    print(f"\n{len(steps)} steps: max |Δ logits| {logits:.2e} (at decisions {decision:.2e}), "
          f"max |Δ hidden| {hidden:.2e}; per unit on vLLM: {', '.join(f'{t * 1000:.0f} ms' for t in timings)}")
    assert logits < TOLERANCE and hidden < TOLERANCE


async def test_the_units_are_the_torch_units(vllm_thinker: VllmDuplexThinker, torch_thinker: TorchDuplexThinker,
                                             torch_run) -> None:
    torch_session, torch_units, _ = torch_run
    session, units = await vllm_scenario(vllm_thinker, voice_rows(torch_thinker))
    await vllm_thinker.close(session)
    assert [unit.listened for unit in units] == [True, False, False] and units[2].ended_turn
    assert summary(units) == summary(torch_units)
    assert vllm_thinker.schema(session) == torch_thinker.schema(torch_session)


async def test_interleaved_sessions_are_each_as_alone(vllm_thinker: VllmDuplexThinker) -> None:
    inputs = {"a": (speech("speech_en_long.wav", 3), ["speak", "speak", "speak_end"]),
              "b": (speech("speech_en_two_turns.wav", 3), ["listen", "speak", None])}

    async def run(name: str, session: VllmDuplexSession) -> list[UnitResult]:
        audio, script = inputs[name]
        units = []
        for u, decision in enumerate(script):
            units += await vllm_thinker.append_audio(session, unit_audio(audio, u), script=decision)
            await asyncio.sleep(0)  # let the other session's unit in between
        await vllm_thinker.close(session)
        return units

    alone = {name: await run(name, await vllm_thinker.start()) for name in inputs}
    sessions = {name: await vllm_thinker.start() for name in inputs}
    together = await asyncio.gather(*(run(name, session) for name, session in sessions.items()))
    assert [summary(units) for units in together] == [summary(alone[name]) for name in inputs]


async def test_the_context_stays_in_vllm_across_units(vllm_thinker: VllmDuplexThinker,
                                                      torch_thinker: TorchDuplexThinker, torch_run) -> None:
    torch_session, _, _ = torch_run
    held = vllm_thinker.engine.get_num_unfinished_requests()
    session, _ = await vllm_scenario(vllm_thinker, voice_rows(torch_thinker))
    assert session.positions == torch_session.positions
    not_sent = sum(len(run) for run in session.pending)  # the last terminator and </unit>, for the next unit
    assert not_sent == 2
    assert session.engine_context == session.engine_forwarded == session.positions - not_sent  # no re-prefill
    assert vllm_thinker.engine.get_num_unfinished_requests() == held + 1  # the request waits for the next unit
    await vllm_thinker.close(session)
    assert vllm_thinker.engine.get_num_unfinished_requests() == held


WINDOWS = {"basic": ContextWindow("basic", high_tokens=120, low_tokens=80),
           "context": ContextWindow("context", max_units=3, previous_max_tokens=20)}
WINDOW_SCRIPT: list[ScriptedDecision] = ["listen", "speak", "speak", "speak_end", "listen", "speak", "speak_end",
                                         "listen", "listen", "speak", "speak_end", "listen"]


@pytest.mark.parametrize("mode", WINDOWS)
async def test_a_sliding_window_rebuilds_the_context_alike_on_both_backends(
        mode: str, vllm_thinker: VllmDuplexThinker, torch_thinker: TorchDuplexThinker) -> None:
    """Past its window a session's oldest units go and a new vLLM request re-prefills the rest:
    the same context, logits and units as the torch backend, which rebuilds its cache alike."""
    window = WINDOWS[mode]
    audio = speech("speech_en_long.wav", len(WINDOW_SCRIPT))
    torch_session = torch_thinker.start(window=window)
    with StepRecorder(torch_thinker) as torch_steps:
        torch_units = [unit for u, script in enumerate(WINDOW_SCRIPT)
                       for unit in torch_thinker.append_audio(torch_session, unit_audio(audio, u), script=script)]
    held = vllm_thinker.engine.get_num_unfinished_requests()
    session = await vllm_thinker.start(window=window)
    units, positions = [], []
    with StepRecorder(vllm_thinker) as steps:
        for u, script in enumerate(WINDOW_SCRIPT):
            units += await vllm_thinker.append_audio(session, unit_audio(audio, u), script=script)
            positions.append(session.positions)
            assert session.engine_context == session.engine_forwarded  # each request prefilled once
    schema = vllm_thinker.schema(session)
    await vllm_thinker.close(session)
    assert vllm_thinker.engine.get_num_unfinished_requests() == held  # every request of the session ended
    assert session.window.slides >= 3 and session.window.slides == torch_session.window.slides
    assert summary(units) == summary(torch_units) and schema == torch_thinker.schema(torch_session)
    logits = max(float((ours.logits - ref.logits).abs().max()) for ours, ref in zip(steps, torch_steps, strict=True))
    print(f"\n{mode} window: {session.window.slides} slides, positions {positions}, max |Δ logits| {logits:.2e}")
    assert logits < TOLERANCE
    if mode == "basic":
        assert max(positions) <= window.high_tokens
    else:
        assert len(session.window.units) == window.max_units and schema[1].startswith("\n\nprevious: ")
