"""The engine as the session layer sees it: a small async interface, so sessions can be
driven by any engine (the real orchestrator, or a scripted stand-in in unit tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from vllm_omni.engine.native_duplex import NativeDuplexEngine
from vllm_omni.engine.replicas import ReplicaStats
from vllm_omni.engine.request import AudioInputStream, EngineOutput, OmniRequest


class EngineClient(Protocol):
    @property
    def speakers(self) -> list[str]:
        """Voice names the model knows (lower case)."""

    @property
    def default_speaker(self) -> str | None:
        """The voice a request without `speaker` gets (None for a model without voices)."""

    @property
    def output_sample_rate(self) -> int:
        """Sample rate of the audio chunks `generate` yields."""

    @property
    def accepts_images(self) -> bool:
        """Whether user turns may carry images (the model sees them and the deploy allows them)."""

    @property
    def native_duplex(self) -> NativeDuplexEngine | None:
        """Unit streams of a model that decides its own turns (None: a turn-based model)."""

    def create_audio_stream(self) -> AudioInputStream:
        """A stream to hand user audio to while the user is still speaking."""

    def generate(self, request: OmniRequest) -> AsyncIterator[EngineOutput]:
        """Stream the request's outputs: text deltas, audio chunks, then one `RequestFinished`.
        Raises `RequestError` (or `StageUnavailableError`) for a request it cannot take."""

    async def abort(self, request_id: str) -> bool:
        """Stop a request in every stage; False if it is not running."""


class ServedEngine(EngineClient, Protocol):
    """What the server needs beyond sessions: health, load and shutdown."""

    def unhealthy_stages(self) -> list[str]:
        """Roles of stages with no replica alive (each one's worker or engine has died or is
        restarting)."""

    def num_active_requests(self) -> int: ...

    def active_requests_by_stage(self) -> dict[str, int]: ...

    def replica_stats(self) -> list[ReplicaStats]:
        """Health and load of every replica of every stage."""

    def shutdown(self) -> None: ...
