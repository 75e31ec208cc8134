"""Turn input: the client's audio gathers in the input buffer, a commit (the client's, or server
VAD's) makes it a user turn, and a response is the engine generating an answer to the
conversation (docs/realtime-api.md §5, §6).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_omni.engine.request import OmniRequest
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.server_event_builders import audio_buffer_cleared, overlap_decision
from vllm_omni.session.capabilities import capabilities
from vllm_omni.session.core import Handlers, SessionCore
from vllm_omni.session.input_track import SealedTurn
from vllm_omni.session.response import ResponseRun

Commit = Callable[[SealedTurn, tuple[str, ...]], None]  # the commit fan-out of a sealed user turn


class TurnInput:
    mode = "turn"  # how session.update reads turn detection (interrupt_response's default)

    def __init__(self, core: SessionCore, commit: Commit | None = None):
        self.core = core
        self.commit: Commit = commit or core.commit

    def handlers(self) -> Handlers:
        core = self.core
        return {
            "input_audio_buffer.append": lambda ev: core.input.append(ev, core.config.input_format),
            "input_audio_buffer.commit": self.commit_input,
            "input_audio_buffer.clear": self.clear_input,
            "input.cancel": self._cancel_input,
            "response.create": core.responses.create,
        }

    def capabilities(self) -> dict[str, Any]:
        return capabilities("turn", max_sessions=self.core.options.max_sessions,
                            image_input=self.core.engine.accepts_images)

    def check_update(self, update: dict[str, Any]) -> None:
        """Every field a session.update may set applies to turn input."""

    # Client events ----------------------------------------------------------------------------

    def commit_input(self, ev: ce.InputAudioBufferCommit) -> None:
        self.commit(self.core.input.commit(), ())
        wants_response = ev.create_response if ev.create_response is not None else ev.response_create
        if wants_response is None:
            wants_response = ev.type == "input.commit"  # that spelling answers by default
        if wants_response:
            self.core.responses.respond_or_defer()

    def clear_input(self, ev: ce.ClientEvent) -> None:
        self.core.input.clear()
        self.core.emit(audio_buffer_cleared())

    def _cancel_input(self, ev: ce.ClientEvent) -> None:
        """input.cancel: drop the input and stop the answer (barge-in by the client)."""
        self.core.input.clear()
        if not self.core.barge_in("barge_in"):
            self.core.emit(audio_buffer_cleared())

    # What the core reports --------------------------------------------------------------------

    def speech_started(self) -> None:
        core, td = self.core, self.core.config.turn_detection
        if core.responses.active is not None and td is not None and td.interrupt_response:
            core.emit(overlap_decision(session_id=core.id, epoch=core.responses.epoch, policy="barge_in_on_speech",
                                       action="barge_in", reason="server_vad_speech_started", metadata={}))
            core.barge_in("turn_detected")

    def server_commit(self, sealed: SealedTurn) -> None:
        self.commit(sealed, ())
        if self.core.config.turn_detection.create_response:
            self.core.responses.respond_or_defer()

    def produce(self, run: ResponseRun, request: OmniRequest, previous_item_id: str | None) -> None:
        run.start(self.core.engine, request, previous_item_id)

    def response_cancelled(self) -> None:
        """Nothing of turn input depends on the response."""

    async def close(self) -> None:
        """Turn input starts nothing of its own (the core's parts close with it)."""
