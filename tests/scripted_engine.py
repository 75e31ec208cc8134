"""A deterministic stand-in engine for session unit tests (a test double: never served).

Each request plays a script: text deltas and audio chunks on a schedule, then a finish; or
it is refused, fails mid-stream, or stalls until aborted. The engine records every request
it got and every abort, so tests can check what the session asked for.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.conftest import audio_fixture_path
from vllm_omni.audio.formats import AudioFormat
from vllm_omni.audio.pcm import MODEL_RATE, StreamingResampler
from vllm_omni.engine.request import (
    AudioChunk,
    AudioInputStream,
    EngineOutput,
    FinishReason,
    OmniRequest,
    RequestFinished,
    StageMetrics,
    TextDelta,
    ToolCall,
    Usage,
)
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.session.base import SessionOptions, ga_only
from vllm_omni.session.factory import ga_session
from vllm_omni.session.session import Session


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Audio:
    ms: int  # a chunk of this much (quiet tone) audio at the engine's rate; skipped for text-only requests


@dataclass(frozen=True)
class Wait:
    seconds: float


@dataclass(frozen=True)
class Stall:
    """Produce nothing more until the request is aborted."""


@dataclass(frozen=True)
class Raise:
    error: Exception  # raised by `generate` at this point (first: the request is refused)


@dataclass(frozen=True)
class Call:
    """The model calls a function (a `ToolCall` output)."""

    name: str
    arguments: str = "{}"
    call_id: str = "call_1"


@dataclass(frozen=True)
class Finish:
    reason: FinishReason = FinishReason.STOP
    error: str | None = None
    error_code: str | None = None


Step = Text | Audio | Call | Wait | Stall | Raise | Finish

ANSWER = (Text("Hello"), Audio(100), Text(" there."), Audio(100))  # a short spoken answer


def _last_audio(steps: tuple[Step, ...], index: int) -> bool:
    """Whether the audio of step `index` is the answer's last, as a real engine marks it: no audio
    follows, and the script goes on to its end without stalling."""
    return not any(isinstance(step, (Audio, Stall, Raise)) for step in steps[index + 1:])


@dataclass
class ScriptedEngine:
    """Plays `queued` scripts in order, then `default` for every further request."""

    default: tuple[Step, ...] = ANSWER
    queued: list[tuple[Step, ...]] = field(default_factory=list)
    speakers: list[str] = field(default_factory=lambda: ["aria", "bruno"])
    default_speaker: str | None = "aria"
    output_sample_rate: int = 24000
    accepts_images: bool = True
    requests: list[OmniRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    _aborts: dict[str, asyncio.Event] = field(default_factory=dict)

    def script(self, *steps: Step) -> None:
        """The next request (after those already queued) plays `steps`."""
        self.queued.append(steps)

    @staticmethod
    def create_audio_stream() -> AudioInputStream:
        return AudioInputStream()

    async def generate(self, request: OmniRequest) -> AsyncIterator[EngineOutput]:
        self.requests.append(request)
        steps = self.queued.pop(0) if self.queued else self.default
        rid = request.request_id
        aborted = self._aborts.setdefault(rid, asyncio.Event())
        text, samples, stage_outputs = "", 0, 0
        for index, step in enumerate(steps):
            if isinstance(step, Raise):
                raise step.error
            if isinstance(step, Finish):
                yield self._finished(rid, step, text, samples, stage_outputs)
                return
            if isinstance(step, Stall):
                await aborted.wait()
            elif isinstance(step, Wait):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(aborted.wait(), step.seconds)
            elif isinstance(step, Text):
                text += step.text
                stage_outputs += 1
                yield TextDelta(rid, step.text, (stage_outputs,))
            elif isinstance(step, Call):
                yield ToolCall(step.call_id, step.name, step.arguments)
            elif isinstance(step, Audio) and "audio" in request.modalities:
                start = samples
                samples += step.ms * self.output_sample_rate // 1000
                yield AudioChunk(rid, tone(samples - start, self.output_sample_rate), self.output_sample_rate,
                                 start / self.output_sample_rate, samples / self.output_sample_rate,
                                 final=_last_audio(steps, index))
            if aborted.is_set():
                yield RequestFinished(rid, FinishReason.ABORT, text=text)
                return
            await asyncio.sleep(0)  # one step at a time: a cancel gets in between
        yield self._finished(rid, Finish(), text, samples, stage_outputs)

    def _finished(self, rid: str, step: Finish, text: str, samples: int, text_tokens: int) -> RequestFinished:
        audio_tokens = samples // (self.output_sample_rate // 12)  # 12.5 codec frames a second, roughly
        metrics = {"llm": StageMetrics(role="llm", stage_id=0, first_output_s=0.01, mean_interval_s=0.02,
                                       intervals_s=(0.02,), outputs=text_tokens, finish_reason=step.reason),
                   "vocoder": StageMetrics(role="vocoder", stage_id=1, first_output_s=0.05, mean_interval_s=None,
                                           intervals_s=(), outputs=audio_tokens)}
        return RequestFinished(rid, step.reason, text=text, token_ids=tuple(range(1, text_tokens + 1)),
                               usage=Usage(prompt_tokens=7, text_tokens=text_tokens, audio_tokens=audio_tokens),
                               audio_duration_s=samples / self.output_sample_rate, stage_metrics=metrics,
                               error=step.error, error_code=step.error_code)

    async def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        event = self._aborts.get(request_id)
        if event is None or event.is_set():
            return False
        event.set()
        return True


def tone(samples: int, rate: int) -> bytes:
    """Quiet 440 Hz PCM16, so audio is never all zeros."""
    t = np.arange(samples) / rate
    return (np.sin(2 * np.pi * 440 * t) * 3000).astype("<i2").tobytes()


# Sessions on it -----------------------------------------------------------------------------

class Events(list):
    """What a session emitted, in order; `wait` lets its response tasks run."""

    def kinds(self, start: int = 0) -> list[str]:
        return [e["type"] for e in self[start:]]

    def of(self, kind: str) -> list[dict]:
        return [e for e in self if e["type"] == kind]

    def last(self, kind: str) -> dict:
        return self.of(kind)[-1]

    def errors(self) -> list[str]:
        return [e["error"]["code"] if isinstance(e["error"], dict) else e["code"] for e in self.of("error")]

    async def wait(self, kind: str, count: int = 1, timeout: float = 5.0) -> dict:
        """Until `count` events of `kind` were emitted; the last of them."""
        deadline = asyncio.get_running_loop().time() + timeout
        while len(self.of(kind)) < count:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no {count}× {kind} within {timeout} s; got {self.kinds()}")
            await asyncio.sleep(0.001)
        return self.of(kind)[count - 1]


def turn_session(engine: ScriptedEngine | None = None, options: SessionOptions | None = None,
                 extensions: bool = True, **config: Any) -> tuple[Session, ScriptedEngine, Events]:
    """A GA turn session (id sess_test, model tiny) on a scripted engine, and its events: with
    the [EXT] events and fields, or (`extensions=False`) what a pure-GA client receives. Its
    input is 16 kHz PCM16 (the test recordings'), as after a session.update saying so, unless
    `input_format` is given."""
    engine = engine or ScriptedEngine()
    events = Events()
    config.setdefault("input_format", AudioFormat("pcm16", 16000))
    session = ga_session(engine, SessionConfig(id="sess_test", model="tiny", **config),
                          options or SessionOptions(served_models=["tiny"]),
                          events.append if extensions else ga_only(events.append))
    return session, engine, events


def pcm16_b64(seconds: float, amplitude: float = 0.0, rate: int = 16000) -> str:
    """`seconds` of a 220 Hz tone (silence at amplitude 0) as base64 PCM16."""
    t = np.arange(int(rate * seconds)) / rate
    return base64.b64encode((np.sin(2 * np.pi * 220 * t) * amplitude * 32767).astype("<i2").tobytes()).decode()


def streamed_at_16k(seconds: float, rate: int) -> int:
    """How many 16 kHz samples `seconds` appended at `rate` put on the timeline before a commit:
    all but the few ms the band-limited resampler holds back (audio/pcm.py)."""
    return StreamingResampler(rate, MODEL_RATE).process(np.zeros(int(rate * seconds))).size if rate != MODEL_RATE \
        else int(rate * seconds)


def speech_appends(name: str, trailing_silence_s: float = 0.0, chunk_ms: int = 100) -> list[dict]:
    """A tests/data recording (plus silence) as input_audio_buffer.append events of `chunk_ms`."""
    with wave.open(str(audio_fixture_path(name))) as wav:
        pcm = wav.readframes(wav.getnframes()) + b"\0\0" * int(16000 * trailing_silence_s)
    step = 32 * chunk_ms
    return [{"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i:i + step]).decode()}
            for i in range(0, len(pcm), step)]
