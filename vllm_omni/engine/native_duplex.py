"""Native full duplex: a model that hears its input unit by unit and decides per unit whether
to listen or to speak (docs/realtime-api.md §13.7; MiniCPM-o 4.5 in docs/minicpmo.md).

A family provides a `UnitModel` (it keeps blocking compute off the event loop itself);
`NativeDuplexEngine` (a `UnitEngine`, engine/interface.py) serves it to sessions, every call
with a timeout, so a stuck unit fails its own call instead of hanging the session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from vllm_omni.engine.replicas import ReplicaStats
from vllm_omni.engine.request import AudioInputStream

T = TypeVar("T")
CALL_TIMEOUT_S = 60.0  # one append (every unit it closes) or one open; far above a unit's compute


class SettingRefused(ValueError):
    """A model's own opening setting (`key`) that it cannot take; `code` is the protocol's
    error code for it (docs/realtime-api.md §9)."""

    def __init__(self, code: str, message: str, key: str):
        super().__init__(message)
        self.code, self.message, self.key = code, message, key


@dataclass(frozen=True)
class DuplexOpening:
    """What a native session's model context starts from."""

    instructions: str | None = None  # the system prompt; None: the model's default
    voice_prompt: np.ndarray | None = None  # 16 kHz float32 reference speech (`ref_audio`)
    wants_audio: bool = True  # speaking units are voiced (else text only)
    initial_user_text: str | None = None  # the user's opening turn, as text: the model answers it
    # the model's own settings: the keys of its `setting_keys` the opening's extra_body set,
    # as its `check_settings` accepted them
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UnitDecision:
    """One unit's outcome: the model spoke `text` as `audio`, or listened. A unit that closes the
    model's turn without words (a forced listen) may still carry the turn's last audio."""

    spoke: bool  # the model said something in this unit
    text: str = ""
    audio: bytes = b""  # PCM16 at the model's output rate
    end_of_turn: bool = False  # the model ended its turn in this unit
    token_times_s: tuple[float, ...] = ()  # when the thinker chose each of the unit's tokens (monotonic)


class UnitSession(Protocol):
    """One conversation of a `UnitModel`; its calls never overlap."""

    async def append(self, samples: np.ndarray, frame_groups: Sequence[Sequence[bytes]],
                     force_listen: bool) -> list[UnitDecision]:
        """Take 16 kHz float32 samples; decide every unit they close. `frame_groups` (each an
        append's JPEG or PNG images, in arrival order) bind one per unit to the units that close
        from now on (docs/realtime-api.md §13.8); `force_listen` makes each unit closed here listen."""

    def samples_to_boundary(self) -> int:
        """Input samples still missing before the next unit closes (0 right on a boundary)."""

    async def close(self) -> None: ...


class UnitModel(Protocol):
    """A family's natively duplex model, as `NativeDuplexEngine` serves it."""

    output_sample_rate: int
    unit_ms: int  # input per decision
    first_unit_ms: int  # input that closes the first unit
    setting_keys: frozenset[str]  # the opening's extra_body keys the model reads (DuplexOpening.settings)
    needs_voice_prompt: bool  # it speaks in the voice of the opening's voice_prompt (else its own)

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        """Raise SettingRefused for an opening's settings the model cannot take."""

    def check_update(self, settings: Mapping[str, Any]) -> None:
        """Raise SettingRefused for settings a session.update may not change once open."""

    async def open(self, opening: DuplexOpening) -> UnitSession: ...

    def shutdown(self) -> None: ...


class HeldAudioStream(AudioInputStream):
    """A user turn's samples as they arrive, for a commit-driven session to hand the model at
    commit (the model computes its own features, unit by unit)."""

    def __init__(self) -> None:
        self.closed = False
        self._pieces: list[np.ndarray] = []

    def _take(self, samples: np.ndarray) -> None:
        self._pieces.append(samples)

    @property
    def num_samples(self) -> int:
        return sum(piece.size for piece in self._pieces)

    def close(self) -> np.ndarray:
        """The turn's 16 kHz float32 samples."""
        self.closed = True
        self._pieces = [np.concatenate(self._pieces) if self._pieces else np.zeros(0, np.float32)]
        return self._pieces[0]


class NativeDuplexStream:
    """A session's handle on the model (one caller: the session's feeder, in order)."""

    def __init__(self, engine: NativeDuplexEngine, session: UnitSession):
        self._engine, self._session = engine, session
        self.closed = False

    async def append(self, samples: np.ndarray, *, frame_groups: Sequence[Sequence[bytes]] = (),
                     force_listen: bool = False) -> list[UnitDecision]:
        return await self._engine.call(self._session.append(samples, frame_groups, force_listen))

    def samples_to_boundary(self) -> int:
        return self._session.samples_to_boundary()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._engine.open_streams -= 1
            await self._engine.call(self._session.close())


class NativeDuplexEngine:
    """The unit engine of a natively duplex model: each session opens its stream (`open_stream`)."""

    def __init__(self, model: UnitModel, *, call_timeout_s: float = CALL_TIMEOUT_S):
        self.model = model
        self.call_timeout_s = call_timeout_s
        self.open_streams = 0
        self._waiting_calls = 0

    async def call(self, work: Awaitable[T]) -> T:
        """`work`'s result; TimeoutError past the call timeout."""
        self._waiting_calls += 1
        try:
            return await asyncio.wait_for(work, self.call_timeout_s)
        finally:
            self._waiting_calls -= 1

    async def open_stream(self, opening: DuplexOpening) -> NativeDuplexStream:
        session = await self.call(self.model.open(opening))
        self.open_streams += 1
        return NativeDuplexStream(self, session)

    # UnitEngine (engine/interface.py) -----------------------------------------------------------

    @property
    def unit_ms(self) -> int:
        return self.model.unit_ms

    @property
    def first_unit_ms(self) -> int:
        return self.model.first_unit_ms

    @property
    def setting_keys(self) -> frozenset[str]:
        return self.model.setting_keys

    @property
    def needs_voice_prompt(self) -> bool:
        return self.model.needs_voice_prompt

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        self.model.check_settings(settings)

    def check_update(self, settings: Mapping[str, Any]) -> None:
        self.model.check_update(settings)

    @property
    def speakers(self) -> list[str]:
        return []

    @property
    def default_speaker(self) -> str | None:
        return None

    @property
    def output_sample_rate(self) -> int:
        return self.model.output_sample_rate

    @property
    def accepts_images(self) -> bool:
        return False  # frames ride the audio appends (docs/realtime-api.md §13.8), not user items

    def create_audio_stream(self) -> AudioInputStream:
        return HeldAudioStream()

    # ServedEngine ------------------------------------------------------------------------------

    def unhealthy_stages(self) -> list[str]:
        return []

    def num_active_requests(self) -> int:
        return self.open_streams

    def active_requests_by_stage(self) -> dict[str, int]:
        return {"duplex": self.open_streams}

    def replica_stats(self) -> list[ReplicaStats]:
        return [ReplicaStats("duplex", 0, True, self.open_streams, self._waiting_calls)]

    def shutdown(self) -> None:
        self.model.shutdown()
