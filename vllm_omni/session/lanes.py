"""A session's lane part: how `session.update` applies and which lane-only client events it
takes (docs/realtime-api.md §1.2, §2.2, §13.2, §13.9).

GA applies what is valid and reports each rejected group. The duplex lane is opened by its
first session object, applies updates atomically (the first problem refuses all of it),
keeps some fields fixed once open, and runs `turn.signal`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import turn_event
from vllm_omni.protocol.session_update import SessionUpdateResult, apply_session_update
from vllm_omni.protocol.states import Lane
from vllm_omni.session.core import Handlers, SessionCore
from vllm_omni.session.tools import engine_tool_choice, engine_tools

Dispatch = Callable[[ce.ClientEvent], Awaitable[None]]
# Malformed tools are refused by session.update, not at the next answer (docs/realtime-api.md §2.3)
TOOL_CHECKS = {"tools": lambda tools: engine_tools(tools, "session.tools"),
               "tool_choice": lambda choice: engine_tool_choice(choice, "session.tool_choice")}
REF_AUDIO_PATHS = ("ref_audio_path", "tts_ref_audio_path")
OPEN_TIME_ONLY = ("idle_timeout_s",)  # read when a duplex session opens; later values are ignored
KEPT_CODES = ("model_not_found",)  # opening failures reported under their own code
# turn.signal events run as these client events (docs/realtime-api.md §13.9) ...
SIGNAL_COMMANDS = frozenset({"input.cancel", "barge_in", "response.cancel", "output_audio_buffer.clear",
                             "session.update", "conversation.item.create", "conversation.item.delete",
                             "conversation.item.truncate", "conversation.item.retrieve"})
# ... and these set the turn state; any other is answered without changing it
SIGNAL_STATES = {"user_started": "user_speaking", "user_speaking": "user_speaking",
                 "user_committed": "user_committed", "assistant_started": "assistant_generating",
                 "assistant_done": "assistant_playing", "playback_ack": "idle", "timeout": "idle", "close": "idle"}


class GaLane:
    lane = Lane.GA

    def __init__(self, core: SessionCore, mode: str):
        self.core = core
        self._mode = mode  # how session.update reads turn detection (interrupt_response's default)

    def handlers(self, dispatch: Dispatch) -> Handlers:
        return {}

    def update(self, update: dict[str, Any]) -> SessionUpdateResult:
        """What is valid applies; each rejected group is reported (docs/realtime-api.md §2.2)."""
        return _apply(self.core, update, self._mode)


class DuplexLane:
    lane = Lane.DUPLEX

    def __init__(self, core: SessionCore, mode: str):
        self.core = core
        self._mode = mode

    def handlers(self, dispatch: Dispatch) -> Handlers:
        async def turn_signal(ev: ce.TurnSignal) -> None:
            """A command by name, run with `payload` as its body (errors name this event's id),
            or a turn-state change answered with turn.event (docs/realtime-api.md §13.9)."""
            if ev.event is None:
                raise ProtocolError("bad_event", "turn.signal requires event", "event")
            if ev.event in SIGNAL_COMMANDS:
                await dispatch(ce.parse_client_event({**(ev.payload or {}), "type": ev.event}))
                return
            core = self.core
            core.turn_state = SIGNAL_STATES.get(ev.event, core.turn_state)
            core.emit(turn_event(session_id=core.id, event_name=ev.event, epoch=core.responses.epoch,
                                 turn_state="assistant_generating" if core.responses.active else core.turn_state))

        return {"turn.signal": turn_signal}

    def open(self, opening: dict[str, Any]) -> None:
        """The opening session object, open-time fields included; any problem refuses the open."""
        result = _apply(self.core, opening, self._mode)
        if result.rejected:
            problem = result.rejected[0]
            if problem.code in KEPT_CODES:
                raise problem
            raise ProtocolError("invalid_session_config", f"{problem.code}: {problem.message}", problem.param)
        self.core.config = result.config
        self.core.input.configure(result.config.turn_detection)

    def update(self, update: dict[str, Any]) -> SessionUpdateResult:
        """Atomic: the first problem refuses it all (docs/realtime-api.md §13.2)."""
        check_model_fields(update)
        if "ref_audio" in update:
            raise ProtocolError("ref_audio_update_unsupported", "ref_audio can only be set when the session opens",
                                "ref_audio")
        result = _apply(self.core, {k: v for k, v in update.items() if k not in OPEN_TIME_ONLY}, self._mode)
        if result.rejected:
            raise result.rejected[0]
        voice = result.config.voice
        if voice is not None and voice != self.core.config.voice and self.core.responses.spoke:  # fixed once spoken
            raise ProtocolError("voice_update_after_audio_unsupported", "the voice cannot change once the session "
                                "has produced audio", "voice")
        return result


def check_model_fields(opening: dict[str, Any]) -> None:
    """What no duplex model takes (voice prompts come as `ref_audio` data)."""
    for key in REF_AUDIO_PATHS:
        if key in opening:
            raise ProtocolError("unsupported_ref_audio_path", f"{key} is not supported; send ref_audio", key)


def _apply(core: SessionCore, update: dict[str, Any], mode: str) -> SessionUpdateResult:
    return apply_session_update(core.config, update, core.options.served_models, mode=mode,
                                vad_defaults=core.options.turn_detection_defaults, checks=TOOL_CHECKS)
