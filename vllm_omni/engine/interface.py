"""The engine as the session layer sees it: two small async interfaces sharing what describes an
engine, so sessions can be driven by any engine (the real ones, or a scripted stand-in in unit
tests).

A turn engine (`TurnEngine`: the stage pipeline of engine/orchestrator.py, or its remote
frontend) `generate`s each request's streams. A unit engine (`UnitEngine`: engine/unit_engine.py
serving a family's `UnitModel`) `open`s one unit stream per session, for a model that hears
its input unit by unit and decides itself when to speak.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol, runtime_checkable

from vllm_omni.engine.native_duplex import DuplexOpening, NativeDuplexStream
from vllm_omni.engine.replicas import ReplicaStats
from vllm_omni.engine.request import AudioInputStream, EngineOutput, OmniRequest


class EngineInfo(Protocol):
    @property
    def speakers(self) -> list[str]:
        """Voice names the model knows (lower case)."""

    @property
    def default_speaker(self) -> str | None:
        """The voice a request without `speaker` gets (None for a model without voices)."""

    @property
    def output_sample_rate(self) -> int:
        """Sample rate of the audio the engine produces."""

    @property
    def accepts_images(self) -> bool:
        """Whether user turns may carry images (the model sees them and the deploy allows them)."""

    def create_audio_stream(self) -> AudioInputStream:
        """A stream to hand a user turn's audio to while the user is still speaking."""


class TurnEngine(EngineInfo, Protocol):
    def generate(self, request: OmniRequest) -> AsyncIterator[EngineOutput]:
        """Stream the request's outputs: text deltas, audio chunks, then one `RequestFinished`.
        Raises `RequestError` (or `StageUnavailableError`) for a request it cannot take."""

    async def abort(self, request_id: str) -> bool:
        """Stop a request in every stage; False if it is not running."""


@runtime_checkable
class UnitEngine(EngineInfo, Protocol):
    @property
    def unit_ms(self) -> int:
        """How much input the model hears per decision (docs/realtime-api.md §13.7)."""

    @property
    def first_unit_ms(self) -> int:
        """How much input closes the first unit (MiniCPM-o's is 30 ms longer than the rest)."""

    @property
    def setting_keys(self) -> frozenset[str]:
        """The opening's `extra_body` keys the model reads itself (DuplexOpening.settings)."""

    @property
    def needs_voice_prompt(self) -> bool:
        """The model speaks in the voice of the session's `ref_audio` (so audio output needs it);
        else it has its own voice."""

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        """Raise SettingRefused (engine/native_duplex.py) for settings the model cannot take."""

    def check_update(self, settings: Mapping[str, Any]) -> None:
        """Raise SettingRefused for settings a session.update may not change once open."""

    async def open_stream(self, opening: DuplexOpening) -> NativeDuplexStream:
        """A session's unit stream, its context started from `opening`."""


EngineClient = TurnEngine | UnitEngine


class ServedEngine(EngineInfo, Protocol):
    """What the server needs beyond sessions: health, load and shutdown."""

    def unhealthy_stages(self) -> list[str]:
        """Roles of stages with no replica alive (each one's worker or engine has died or is
        restarting)."""

    def num_active_requests(self) -> int: ...

    def active_requests_by_stage(self) -> dict[str, int]: ...

    def replica_stats(self) -> list[ReplicaStats]:
        """Health and load of every replica of every stage."""

    def shutdown(self) -> None: ...
