"""The contract between the engine's stage workers and a model family's stage programs.

A stage program holds the per-request state of one stage (KV caches, decoder state) and
advances one request by one step at a time. It runs inside a single worker thread, so it
needs no locking. What a step produces leaves through `emit(request_id, event)`: the
generic events below, which the engine turns into client outputs, or family-specific
messages, which the family's router turns into the next stage's inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from vllm_omni.engine.pacing import PaceSnapshot

Emit = Callable[[str, object], None]


class StageOutput:
    """Base of the events that count as a stage's outputs (tokens, frames, chunks), which
    the engine timestamps for per-stage latency metrics."""


@dataclass(frozen=True)
class TextToken(StageOutput):
    """A generated text token; `fed` is False for the last one (never fed back)."""

    token_id: int
    fed: bool


@dataclass(frozen=True)
class AudioSamples(StageOutput):
    samples: np.ndarray  # float32 in [-1, 1]
    sample_rate: int
    final: bool = False  # the request's last audio: decoded from the last frames its audio stage had


@dataclass(frozen=True)
class StageDone:
    reason: str  # "stop" | "length"
    outputs: int  # tokens, frames or chunks produced
    cached_prompt_tokens: int = 0  # prompt positions an engine's prefix cache served (the text stage's)


class StageProgram(Protocol):
    def accept(self, request_id: str, message: object) -> None:
        """Take a message for a request (the first one creates its state)."""

    def drop(self, request_id: str) -> None:
        """Forget a request and free its state (abort or end)."""

    def runnable(self) -> list[str]:
        """Requests that can make progress now, in arrival order."""

    def step(self, request_id: str, emit: Emit) -> None:
        """Advance one request by one step."""

    def request_ids(self) -> list[str]:
        """Requests holding state in this stage, in arrival order."""


@runtime_checkable
class BatchedStageProgram(StageProgram, Protocol):
    """A stage program that can advance several requests in one call, sharing their work
    (one pass of a model over their inputs stacked on the batch dimension). The step worker
    then hands each round's requests to one `step_batch` instead of one `step` each."""

    def step_batch(self, request_ids: list[str], emit: Emit) -> None:
        """Advance each of `request_ids` (distinct, all holding state, the most urgent first)
        by one step, emitting each request's events as `step` would, each as soon as they
        exist (the first request's are not held back by the rest of the call's work). An
        exception fails every request of the call still holding state: their steps may be
        half done, so none can be retried one by one."""


@runtime_checkable
class AsyncStageDriver(Protocol):
    """A stage served by an engine with its own scheduler (vLLM's AsyncLLM): one coroutine
    per request instead of steps; batching happens inside the engine."""

    async def start(self) -> None:
        """Bring the engine up (on the stage's event loop; again after `shutdown` to replace
        a dead engine)."""

    def starts_request(self, message: object) -> bool:
        """Whether `message` is the first message of a request (others are follow-ups)."""

    async def run(self, request_id: str, message: object, emit: Emit) -> None:
        """Serve one request to the end; cancellation aborts it in the engine."""

    def feed(self, request_id: str, message: object) -> None:
        """A follow-up message for a running request (called on the stage's event loop)."""

    def forget(self, request_id: str) -> None:
        """Free what `feed` kept for a request; called once its run has ended, however it
        ended (also when it was cancelled before it started)."""

    async def push_pace(self, snapshot: PaceSnapshot) -> None:
        """Hand the engine's scheduler the latest playback pacing (engine/pacing.py)."""

    async def shutdown(self) -> None:
        """Stop the engine."""

    def healthy(self) -> bool:
        """False once the engine has died."""
