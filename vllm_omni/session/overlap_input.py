"""Turn input on the duplex lane (docs/realtime-api.md §13.6): input keeps streaming while an
answer plays, and each append over an answer gets an overlap decision (barge in, keep it for
the next turn, or drop it). Short speech over an answer is a back-channel ("mm-hm"): an empty
turn that is not answered. Idle silence is not kept. At most MAX_PENDING_TURNS spoken turns
wait for an answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from vllm_omni.engine.request import OmniRequest
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import overlap_decision
from vllm_omni.protocol.server_events import new_id
from vllm_omni.session.capabilities import capabilities
from vllm_omni.session.conversation import Item
from vllm_omni.session.core import Handlers, SessionCore
from vllm_omni.session.input_track import InputTrack, SealedTurn
from vllm_omni.session.overlap import decide, sounds_like_speech
from vllm_omni.session.response import ResponseRun
from vllm_omni.session.turn_input import Commit, TurnInput

MAX_PENDING_TURNS = 4  # committed user turns waiting for an answer (§13.2, max_pending_turns_per_session)
BACK_CHANNEL = ("empty", "overlap_ack", "no_response")
SILENT_TURN = ("empty", "not_is_speech", "no_response")
Put = Callable[[ce.InputAudioBufferAppend, np.ndarray], None]


class OverlapTurnInput:
    mode = "duplex"

    def __init__(self, core: SessionCore, commit: Commit | None = None):
        self.core = core
        self.turn = TurnInput(core, commit)
        self.overlap_speech_ms = 0  # speech that arrived while an answer generated, now in the buffer

    def handlers(self) -> Handlers:
        return {**self.turn.handlers(), "input_audio_buffer.append": self.append,
                "input_audio_buffer.commit": self.commit_input, "response.create": self.create_response}

    def capabilities(self) -> dict[str, Any]:
        return capabilities("turn_based_duplex", max_sessions=self.core.options.max_sessions,
                            image_input=self.core.engine.accepts_images)

    def check_update(self, update: dict[str, Any]) -> None:
        """The duplex lane's own checks are the lane part's."""

    # Input while an answer generates ----------------------------------------------------------

    def append(self, ev: ce.InputAudioBufferAppend) -> None:
        """Without server VAD, an append that does not sound like speech while no answer is in
        progress is not kept: `response.listen` says so."""
        core = self.core
        samples = core.input.decode(ev, core.config.input_format)
        if core.responses.active is None and not core.input.detecting \
                and not sounds_like_speech(ev, samples, core.config.overlap_silence_rms):
            core.input.skip(samples)
            core.emit(core.listen("silence_or_noise"))
            return
        self._hold(ev, samples)

    def _hold(self, ev: ce.InputAudioBufferAppend, samples: np.ndarray) -> None:
        """Keep an append's samples for the next turn, or not, by the overlap policy."""
        core = self.core
        if core.responses.active is None:
            self._take(ev, samples)
            return
        policy = core.config.overlap_policy
        decision = decide(ev, samples, policy=policy, vad_on=core.input.detecting,
                          silence_rms=core.config.overlap_silence_rms)
        if decision is None:  # server VAD decides (TurnInput.speech_started)
            self._take(ev, samples)
            return
        duration_ms = samples.size // 16
        core.emit(overlap_decision(session_id=core.id, epoch=core.responses.epoch, policy=policy,
                                   action=decision.action, reason=decision.reason,
                                   metadata={"duration_ms": duration_ms, "buffer_audio": decision.keep}))
        if decision.action == "barge_in":
            core.barge_in("barge_in")
        elif decision.keep:
            self.overlap_speech_ms += duration_ms
        if decision.keep:
            self._take(ev, samples)

    def _take(self, ev: ce.InputAudioBufferAppend, samples: np.ndarray) -> None:
        place(self.core.input, ev, samples, self.core.input.take, self.core.config.overlap_silence_rms)

    def commit_input(self, ev: ce.InputAudioBufferCommit) -> None:
        core = self.core
        if core.input.pending.size == 0 and (core.input.skipped_silence or ev.is_speech is False):
            self._silent_commit()
            return
        if core.responses.active is not None and 0 < self.overlap_speech_ms <= core.config.overlap_short_ack_ms:
            item_id = core.input.close_speech() or new_id("item_")
            core.input.clear()
            self._back_channel(SealedTurn(Item(id=item_id, role="user"), 0))
            return
        pending = self._pending_turns()
        if pending >= MAX_PENDING_TURNS:
            raise ProtocolError("input_backpressure", f"{pending} committed turns are waiting for an answer; at most "
                                f"{MAX_PENDING_TURNS} may wait (the buffer is kept): send response.create first")
        self.overlap_speech_ms = 0
        self.turn.commit_input(ev)

    def _pending_turns(self) -> int:
        """Spoken user turns committed after the conversation's last answer."""
        pending = 0
        for item in reversed(self.core.items.conversation.items):
            if item.role == "assistant":
                break
            pending += item.role == "user" and item.audio_ms > 0
        return pending

    async def create_response(self, ev: ce.ResponseCreate) -> None:
        """A duplex response answers new input: committed audio, or user items (§13.2)."""
        responses = self.core.responses
        if ev.response.input is None and responses.active is None and not responses.unanswered:
            raise ProtocolError("response_create_without_input", "response.create requires committed audio (or a "
                                "new user item) to answer")
        await responses.create(ev)

    def _back_channel(self, sealed: SealedTurn) -> None:
        """Short speech over an answer ("mm-hm"): an empty turn that is not answered."""
        self.overlap_speech_ms = 0
        self.core.empty_turn(sealed, BACK_CHANNEL, self.turn.commit)

    def _silent_commit(self) -> None:
        """A commit of only non-speech (or `is_speech:false` with nothing pending): an empty
        turn that is not answered, whatever the commit asked, then `response.listen`."""
        self.core.input.clear()
        self.core.empty_turn(SealedTurn(Item(id=new_id("item_"), role="user", is_speech=False), 0),
                             SILENT_TURN, self.turn.commit)
        self.core.emit(self.core.listen("silence_or_noise"))

    # What the core reports --------------------------------------------------------------------

    def speech_started(self) -> None:
        self.turn.speech_started()

    def server_commit(self, sealed: SealedTurn) -> None:
        """Server VAD's turn; speech this short over an answer is a back-channel."""
        core, td = self.core, self.core.config.turn_detection
        speech_ms = sealed.samples / 16 - td.prefix_padding_ms - td.silence_duration_ms
        if core.responses.active is not None and speech_ms <= core.config.overlap_short_ack_ms:
            sealed.item.stream, sealed.item.audio_ms = None, 0
            self._back_channel(sealed)
            return
        self.turn.server_commit(sealed)

    def produce(self, run: ResponseRun, request: OmniRequest, previous_item_id: str | None) -> None:
        self.turn.produce(run, request, previous_item_id)

    def response_cancelled(self) -> None:
        """Nothing of this input depends on the response."""

    async def close(self) -> None:
        """It starts nothing of its own."""


def place(track: InputTrack, ev: ce.InputAudioBufferAppend, samples: np.ndarray, put: Put,
          silence_rms: float) -> None:
    """`put` the samples on `track`; without server VAD the first append that sounds like speech
    opens a speech segment where it starts."""
    start = track.timeline
    speech = not track.detecting and track.segment_item is None and sounds_like_speech(ev, samples, silence_rms)
    put(ev, samples)
    if speech:
        track.open_heuristic_segment(ev, start)
