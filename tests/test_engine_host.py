"""The engine host and its remote engines (`--api-server-count N`): a frontend's sessions see
the host's engine through a Unix socket exactly as they would see it in their own process.
The engine here is the scripted stand-in; tests/test_api_frontends.py serves the real one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
import pytest

from tests.scripted_engine import Audio, Raise, ScriptedEngine, Stall, Text
from vllm_omni.engine.engine_host import EngineHost, refusal
from vllm_omni.engine.remote_engine import RemoteEngine
from vllm_omni.engine.replicas import ReplicaStats
from vllm_omni.engine.request import (
    AudioChunk,
    EngineBusyError,
    Message,
    OmniRequest,
    RequestFinished,
    StageUnavailableError,
    TextDelta,
)


@dataclass
class HostedEngine(ScriptedEngine):
    """The scripted engine with the health and load a served engine reports."""

    dead: list[str] = field(default_factory=list)

    def unhealthy_stages(self) -> list[str]:
        return self.dead

    def num_active_requests(self) -> int:
        return len(self.requests) - len(self.aborted)

    def active_requests_by_stage(self) -> dict[str, int]:
        return {"llm": self.num_active_requests()}

    def replica_stats(self) -> list[ReplicaStats]:
        return [ReplicaStats("llm", 0, not self.dead, self.num_active_requests(), 0)]


@pytest.fixture
async def hosted(tmp_path):
    engine = HostedEngine()
    host = EngineHost(engine, str(tmp_path / "engine.sock"))
    await host.start()
    remote = await RemoteEngine.connect(host.socket_path)
    yield engine, host, remote
    remote.shutdown()
    await host.close()


async def until(condition, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_outputs_cross_unchanged_and_audio_leaves_as_features(hosted) -> None:
    engine, _, remote = hosted
    assert (remote.speakers, remote.default_speaker, remote.output_sample_rate) == (["aria", "bruno"], "aria", 24000)
    engine.script(Text("Hi"), Audio(100), Text(" you."))
    stream = remote.create_audio_stream()
    stream.append(np.sin(np.arange(16000, dtype=np.float32) / 9))
    request = OmniRequest([Message("user", audio_stream=stream)], speaker="bruno")
    outputs = [item async for item in remote.generate(request)]
    assert [type(item) for item in outputs] == [TextDelta, AudioChunk, TextDelta, RequestFinished]
    assert "".join(item.text for item in outputs[:3:2]) == outputs[-1].text == "Hi you."
    assert len(outputs[1].pcm16) == 2 * 2400  # 100 ms of PCM16 at 24 kHz
    hosted_request = engine.requests[0]
    assert (hosted_request.request_id, hosted_request.speaker) == (request.request_id, "bruno")
    hosted_stream = hosted_request.messages[0].audio_stream
    assert hosted_stream.closed and np.array_equal(hosted_stream.close(), stream.close())


async def test_a_refused_request_raises_the_engines_error(hosted) -> None:
    engine, _, remote = hosted
    engine.script(Raise(EngineBusyError("the engine is full: 32 requests")))
    with pytest.raises(EngineBusyError, match="the engine is full: 32 requests"):
        async for _ in remote.generate(OmniRequest([Message("user", text="hi")])):
            pass


async def test_a_caller_that_stops_listening_aborts_the_request(hosted) -> None:
    engine, _, remote = hosted
    engine.script(Text("Hi"), Stall())
    request = OmniRequest([Message("user", text="hi")])
    outputs = remote.generate(request)
    assert isinstance(await anext(outputs), TextDelta)
    await outputs.aclose()
    await until(lambda: request.request_id in engine.aborted)
    assert await remote.abort(request.request_id) is False  # already stopped


async def test_health_and_load_follow_the_host(hosted) -> None:
    engine, _, remote = hosted
    assert remote.unhealthy_stages() == [] and remote.replica_stats()[0].healthy
    engine.dead = ["llm"]
    await until(lambda: remote.unhealthy_stages() == ["llm"])
    assert not remote.replica_stats()[0].healthy


async def test_the_session_directory_forgets_a_frontend_that_left(hosted) -> None:
    _, host, remote = hosted
    other = await RemoteEngine.connect(host.socket_path)
    other.claim("duplex-1", "127.0.0.1:4001")
    await until(lambda: "duplex-1" in host._owners)
    assert await remote.owner("duplex-1") == "127.0.0.1:4001"
    assert await remote.owner("duplex-2") is None
    other.shutdown()
    await until(lambda: "duplex-1" not in host._owners)
    assert await remote.owner("duplex-1") is None


async def test_when_the_host_goes_away_requests_in_flight_fail(hosted) -> None:
    engine, host, remote = hosted
    engine.script(Text("Hi"), Stall())
    outputs = remote.generate(OmniRequest([Message("user", text="hi")]))
    assert isinstance(await anext(outputs), TextDelta)
    await host.close()
    with pytest.raises(StageUnavailableError, match="engine host went away"):
        await asyncio.wait_for(anext(outputs), 5)
    assert remote.closed.is_set()
    with pytest.raises(StageUnavailableError):
        await anext(remote.generate(OmniRequest([Message("user", text="again")])))


@dataclass
class HostedUnitEngine(HostedEngine):
    """A unit engine's shape (engine/interface.py UnitEngine): its sessions' state lives in its process."""

    unit_ms: int = 80
    first_unit_ms: int = 80
    setting_keys: frozenset[str] = frozenset()
    needs_voice_prompt: bool = False

    def check_settings(self, settings) -> None:
        """It reads no settings."""

    def check_update(self, settings) -> None:
        """It reads no settings."""

    async def open_stream(self, opening):
        raise AssertionError("never opened here")


def test_a_unit_engine_is_refused(tmp_path) -> None:
    engine = HostedUnitEngine()
    assert "turn-based models only" in refusal(engine)
    with pytest.raises(ValueError, match="--api-server-count 1"):
        EngineHost(engine, str(tmp_path / "engine.sock"))
    assert refusal(HostedEngine()) is None
