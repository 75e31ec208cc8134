"""A native duplex response (docs/realtime-api.md §13.7): what it may answer (spoken turns
only: the model hears audio, never typed text) and stage 0's token timing, from when the unit
loop chose each token of the units that make up the response."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from vllm_omni.engine.request import StageMetrics
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.session.conversation import Item

THINKER_STAGE_ID = 0


def pending_user_input(items: Sequence[Item]) -> tuple[bool, bool]:
    """Whether user items since the conversation's last answer hold speech, and typed text."""
    spoken = typed = False
    for item in reversed(items):
        if item.role == "assistant":
            break
        spoken = spoken or (item.role == "user" and item.audio_ms > 0)
        typed = typed or (item.role == "user" and bool(item.text))
    return spoken, typed


def no_spoken_turn(typed: bool) -> ProtocolError:
    """`response.create` with no spoken turn to answer (docs/realtime-api.md §13.7)."""
    if typed:
        return ProtocolError("text_only_turn_unsupported", "this model answers spoken turns only "
                             "(supports_text_only_turn: false): commit audio, or open the session with "
                             "initial_user_text")
    return ProtocolError("response_create_without_input", "response.create requires committed audio to answer")


class ResponseTokenClock:
    """The token times of the response the model is speaking (one at a time). TTFT runs from
    the submission of the response's first speaking unit to its first token; the inter-token
    latencies run over every token of the response's units, in order."""

    def __init__(self) -> None:
        self._response_id: str | None = None
        self._submitted_s = self._unit_submitted_s = 0.0
        self._times: list[float] = []

    def submitting(self) -> None:
        """An append goes to the model now: the units it closes were submitted now."""
        self._unit_submitted_s = time.monotonic()

    def unit(self, response_id: str, token_times_s: Sequence[float]) -> None:
        """One unit of `response_id`, from the last append submitted."""
        if response_id != self._response_id:
            self._response_id, self._submitted_s, self._times = response_id, self._unit_submitted_s, []
        self._times.extend(token_times_s)

    def finish(self, response_id: str) -> dict[str, StageMetrics]:
        """Stage 0's metrics for the response (none if it got no units), by role."""
        if response_id != self._response_id or not self._times:
            return {}
        intervals = np.diff(np.asarray(self._times)).tolist()
        self._response_id = None
        return {"thinker": StageMetrics(
            role="thinker", stage_id=THINKER_STAGE_ID, first_output_s=max(self._times[0] - self._submitted_s, 0.0),
            mean_interval_s=float(np.mean(intervals)) if intervals else None, intervals_s=tuple(intervals),
            outputs=len(self._times))}
