"""Which session a connection gets (factory routes, lane choice), the legacy lane on the
scripted engine, the one dispatch table, and the server settings that feed sessions."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Protocol

import pytest

import vllm_omni.session
from tests.scripted_engine import Audio, Events, Raise, ScriptedEngine, Text, pcm16_b64, turn_session
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.protocol.states import Lane, SessionMode
from vllm_omni.server.settings import ServerSettings
from vllm_omni.session import core as session_core
from vllm_omni.session import turn_lanes
from vllm_omni.session.base import SessionOptions
from vllm_omni.session.factory import DuplexRoute, SessionFactory, SessionRefused
from vllm_omni.session.legacy_session import LegacySession

APPEND = {"type": "input_audio_buffer.append", "audio": pcm16_b64(0.2, 0.1), "sample_rate_hz": 16000}


def factory(mode: SessionMode = SessionMode.TURN, engine: ScriptedEngine | None = None) -> SessionFactory:
    return SessionFactory(engine or ScriptedEngine(), SessionOptions(served_models=["tiny"], session_mode=mode,
                                                                     default_speaker="bruno"))


@pytest.mark.parametrize(("mode", "duplex_endpoint", "query", "refusal"), [
    (SessionMode.TURN, True, None, "Duplex API is not available"),
    (SessionMode.TURN, False, "1", "VAD realtime is not enabled"),
    (SessionMode.TURN, False, "On", "VAD realtime is not enabled"),
    (SessionMode.DUPLEX, False, "0", "Realtime API is not available"),
    (SessionMode.DUPLEX, False, "off", "Realtime API is not available"),
])
def test_routes_without_a_session_kind_are_refused(mode, duplex_endpoint, query, refusal) -> None:
    with pytest.raises(SessionRefused) as refused:
        factory(mode).route(duplex_endpoint=duplex_endpoint, duplex_query=query)
    assert (refused.value.code, refused.value.message) == ("unsupported", refusal)


@pytest.mark.parametrize(("duplex_endpoint", "query"), [(False, None), (False, "1"), (False, "Yes"), (True, None),
                                                        (True, "0")])
def test_duplex_routes_open_by_handshake(duplex_endpoint: bool, query: str | None) -> None:
    assert isinstance(factory(SessionMode.DUPLEX).route(duplex_endpoint=duplex_endpoint, duplex_query=query),
                      DuplexRoute)


@pytest.mark.parametrize("mode", [SessionMode.TURN, SessionMode.DUPLEX])
def test_a_duplex_query_that_is_no_boolean_is_a_client_error(mode: SessionMode) -> None:
    with pytest.raises(ProtocolError) as problem:
        factory(mode).route(duplex_endpoint=False, duplex_query="maybe")
    assert (problem.value.code, problem.value.param) == ("bad_event", "duplex")


@pytest.mark.parametrize("query", [None, "0", "false"])
async def test_a_turn_route_opens_a_greeted_session_whose_lane_is_open(query) -> None:
    events = Events()
    session = factory().route(duplex_endpoint=False, duplex_query=query)("tiny", events.append, True)
    created = events.last("session.created")
    assert created["session"]["id"] == session.id and created["id"].startswith("sess-")
    assert session.lane is None and session.idle_timeout_s == 300.0
    session.report(ProtocolError("bad_event", "x"), "e1")
    assert events.last("error")["error"]["event_id"] == "e1"  # GA shape until the lane is chosen


async def test_ga_lane_gets_the_appends_held_before_the_choice() -> None:
    events = Events()
    session = factory().route(duplex_endpoint=False, duplex_query=None)("tiny", events.append, True)
    await session.handle(APPEND)
    await session.handle(APPEND)
    assert session.lane is None and len(events) == 1
    await session.handle({"type": "input_audio_buffer.commit", "create_response": True})
    assert session.lane is Lane.GA
    await events.wait("response.done")
    assert events.last("conversation.item.done")["item"]["role"] == "assistant"
    await session.handle({"type": "session.update", "session": {"idle_timeout_s": 5}})
    assert session.idle_timeout_s == 5
    await session.close()


async def test_legacy_lane_is_chosen_by_a_flat_update_and_gets_the_held_appends() -> None:
    engine = ScriptedEngine()
    events = Events()
    session = factory(engine=engine).route(duplex_endpoint=False, duplex_query=None)("tiny", events.append, True)
    await session.handle(APPEND)
    await session.handle({"type": "session.update", "model": "tiny"})
    assert session.lane is Lane.LEGACY and events.kinds() == ["session.created"]  # success says nothing
    await session.handle({"type": "input_audio_buffer.commit", "final": False})
    await session.handle(APPEND)
    await session.handle({"type": "input_audio_buffer.commit", "final": True})
    await events.wait("response.output_audio.done")
    assert engine.requests[0].messages[0].audio_stream.num_samples == 6400
    assert engine.requests[0].speaker == "bruno"
    session.report(ProtocolError("bad_event", "x"))
    assert events[-1] == {"type": "error", "error": "x", "code": "bad_event"}


async def test_appends_held_past_the_cap_are_refused(monkeypatch) -> None:
    monkeypatch.setattr(turn_lanes, "MAX_EARLY_APPEND_CHARS", len(APPEND["audio"]) + 1)
    events = Events()
    session = factory().route(duplex_endpoint=False, duplex_query=None)("tiny", events.append, True)
    await session.handle(APPEND)
    await session.handle(APPEND | {"event_id": "late"})
    error = events.last("error")["error"]
    assert (error["code"], error["event_id"]) == ("input_backpressure", "late")


# The legacy lane ------------------------------------------------------------------------------------

def legacy(engine: ScriptedEngine | None = None) -> tuple[LegacySession, ScriptedEngine, Events]:
    engine = engine or ScriptedEngine()
    events = Events()
    config = SessionConfig(id="sess_legacy", model="tiny")
    return LegacySession(engine, config, SessionOptions(served_models=["tiny"]), events.append), engine, events


async def test_legacy_turn_streams_text_and_audio_in_its_own_vocabulary() -> None:
    session, engine, events = legacy()
    await session.handle({"type": "session.update", "model": "tiny"})
    await session.handle({"type": "input_audio_buffer.commit"})  # `final` left out: false
    await session.handle(APPEND)
    await session.handle({"type": "input_audio_buffer.commit", "final": False})  # a second open is ignored
    await session.handle({"type": "input_audio_buffer.commit", "final": True})
    await events.wait("response.output_audio.done")
    assert events.kinds() == ["transcription.delta", "response.output_audio.delta", "transcription.delta",
                              "response.output_audio.delta", "transcription.done", "response.output_audio.done"]
    assert {e["sample_rate_hz"] for e in events.of("response.output_audio.delta")} == {24000}
    done = events.last("transcription.done")
    assert done["text"] == "Hello there." and done["usage"]["total_tokens"] == 9
    assert events[-1]["has_audio"] is True and engine.requests[0].speaker is None


async def test_legacy_errors_are_flat_and_keep_the_session() -> None:
    session, engine, events = legacy()
    engine.script(Text("a"), Raise(RuntimeError("boom")))
    await session.handle({"type": "input_audio_buffer.commit"})
    await session.handle({"type": "session.update"})
    await session.handle({"type": "session.update", "model": "gpt-9"})
    await session.handle({"type": "session.update", "model": "tiny"})
    await session.handle({"type": "input_audio_buffer.append", "audio": 5})
    await session.handle({"type": "input_audio_buffer.append", "audio": "%%%"})
    await session.handle({"type": "response.create"})
    await session.handle({"type": "session.close"})
    assert events.errors() == ["model_not_validated", "invalid_event", "model_not_found", "processing_error",
                               "invalid_audio", "unknown_event", "unknown_event"]
    assert all(set(e) == {"type", "error", "code"} for e in events)
    await session.handle({"type": "input_audio_buffer.commit", "final": False})
    await session.handle({"type": "input_audio_buffer.commit", "final": True})
    await events.wait("response.output_audio.done")
    assert events.errors()[-1] == "processing_error" and events[-1]["has_audio"] is False


async def test_legacy_close_stops_the_generation() -> None:
    session, engine, events = legacy()
    engine.script(Text("a"), Audio(100), *[Audio(100)] * 50)
    await session.handle({"type": "session.update", "model": "tiny"})
    await session.handle({"type": "input_audio_buffer.commit"})
    await session.handle({"type": "input_audio_buffer.commit", "final": True})
    await events.wait("transcription.delta")
    await session.close()
    assert session.task.done()
    emitted = len(events)
    await asyncio.sleep(0.01)
    assert len(events) == emitted


# One dispatch table, aliases in one place -------------------------------------------------------------

def test_every_client_event_type_has_one_handler_and_every_alias_a_target() -> None:
    session, _, _ = turn_session()
    handled = set(session._handlers)  # noqa: SLF001
    # the connection ends sessions; turn.signal is the duplex lane's only
    assert handled == set(ce.EVENT_MODELS) - {"session.close", "turn.signal"}
    assert set(ce.ALIASES.values()) <= set(ce.EVENT_MODELS) and not set(ce.ALIASES) & set(ce.EVENT_MODELS)
    for alias, target in ce.ALIASES.items():
        parsed = ce.parse_client_event({"type": alias})
        assert parsed.type == alias and type(parsed) is ce.EVENT_MODELS[target]


def test_the_dispatch_table_is_built_once_and_never_changes() -> None:
    session, _, _ = turn_session()
    with pytest.raises(TypeError):
        session._handlers["session.heartbeat"] = print  # noqa: SLF001


def test_no_session_class_extends_another() -> None:
    """Sessions are composed from parts (session/session.py), never subclassed: every class of
    the session package derives from nothing of the package."""
    package = Path(vllm_omni.session.__file__).parent
    for module_info in pkgutil.iter_modules([str(package)]):
        module = importlib.import_module(f"vllm_omni.session.{module_info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            own_bases = [base for base in cls.__mro__[1:] if base.__module__.startswith("vllm_omni.session")
                         and not issubclass(base, Protocol)]  # an interface is not a session kind
            assert not own_bases, f"{module.__name__}.{name} extends {own_bases}"


# Server settings ---------------------------------------------------------------------------------------

def test_server_settings_feed_the_session_options() -> None:
    settings = ServerSettings(served_model_names=["tiny"], vad_model_path="/v.onnx",
                              turn_detection_defaults={"threshold": 0.6})
    options = settings.session_options()
    assert (options.session_mode, options.default_speaker, options.vad_model_path) == \
        (SessionMode.TURN, None, "/v.onnx")
    assert options.turn_detection_defaults == {"threshold": 0.6}
    with pytest.raises(ValueError, match="unknown fields create_response"):
        ServerSettings(served_model_names=["tiny"], turn_detection_defaults={"create_response": 0.0})
    with pytest.raises(ValueError):
        ServerSettings(served_model_names=["tiny"], session_mode="native")


async def test_parsed_events_are_taken_and_a_handler_bug_is_an_internal_error(monkeypatch) -> None:
    session, _, events = turn_session()
    await session.handle(ce.parse_client_event({"type": "session.heartbeat"}))
    assert events.kinds() == ["session.heartbeat_ack"]

    def broken(**fields) -> dict:
        raise KeyError("bug")

    monkeypatch.setattr(session_core, "heartbeat_ack", broken)
    await session.handle({"type": "session.heartbeat", "event_id": "h"})
    error = events.last("error")["error"]
    assert (error["code"], error["type"], error["event_id"]) == ("internal_error", "server_error", "h")
    await session.handle({"type": "input_audio_buffer.clear"})  # the session goes on
    assert events.kinds()[-1] == "input_audio_buffer.cleared"
