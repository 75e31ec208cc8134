"""session.update parsing: the three shapes, precedence, defaults, validation order, and the
partial-update policy (each setting group applied or rejected on its own)."""

from __future__ import annotations

import pytest

from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.session_config import SessionConfig, session_object
from vllm_omni.protocol.session_update import SessionUpdateResult, apply_session_update
from vllm_omni.session.lanes import TOOL_CHECKS

SERVED = ["tiny"]
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def fresh() -> SessionConfig:
    return SessionConfig(id="sess_1", model="tiny")


def applied(session: dict, current: SessionConfig | None = None) -> SessionUpdateResult:
    return apply_session_update(current or fresh(), session, SERVED, checks=TOOL_CHECKS)


def update(session: dict, current: SessionConfig | None = None) -> SessionConfig:
    result = applied(session, current)
    assert result.rejected == [], [p.message for p in result.rejected]
    return result.config


def error(session: dict, current: SessionConfig | None = None) -> ProtocolError:
    """The first problem of an update none of which applies."""
    result = applied(session, current)
    assert result.rejected and not result.accepted and not result.updated
    assert result.config == (current or fresh())
    return result.rejected[0]


def test_server_vad_defaults_are_filled_and_echoed_in_both_places() -> None:
    config = update({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                         "turn_detection": {"type": "server_vad"}}}})
    echoed = session_object(config, {})
    expected = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
                "create_response": True, "interrupt_response": False, "idle_timeout_ms": None,
                "min_speech_duration_ms": 96}
    assert echoed["audio"]["input"]["turn_detection"] == expected == echoed["turn_detection"]
    assert echoed["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    assert echoed["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert echoed["overlap_policy"] == "listen_only"


def test_flat_keys_win_over_nested_ones() -> None:
    config = update({"input_audio_format": "g711_ulaw", "audio": {"input": {"format": {"type": "audio/pcm"}}},
                     "modalities": ["text"], "output_modalities": ["audio"], "voice": "aiden",
                     "max_response_output_tokens": 12, "max_output_tokens": 99})
    assert (config.input_format.name, config.input_format.rate) == ("g711_ulaw", 8000)
    assert config.modalities == ["text"] and config.voice == "aiden" and config.max_output_tokens == 12


def test_input_rate_precedence_and_ga_default_rate() -> None:
    assert update({"audio": {"input": {"format": {"type": "audio/pcm"}}}}).input_format.rate == 24000
    assert update({"input_audio_format": "pcm16"}).input_format.rate == 16000
    assert update({"sample_rate_hz": 48000, "sample_rate": 8000,
                   "audio": {"input": {"format": {"type": "audio/pcm", "rate": 22050}}}}).input_format.rate == 48000


def test_patch_semantics_keep_what_is_not_sent() -> None:
    first = update({"instructions": "Be brief.", "voice": "ethan"})
    second = update({"temperature": 0.3}, first)
    assert second.instructions == "Be brief." and second.voice == "ethan" and second.temperature == 0.3
    assert update({"instructions": None}, second).instructions is None


def test_max_tokens_spellings_of_unlimited() -> None:
    for value in ("inf", "infinity", "unlimited", None):
        assert update({"max_output_tokens": value}).max_output_tokens == "inf"
    assert update({"max_output_tokens": 64}).max_output_tokens == 64


@pytest.mark.parametrize("session", [
    {"max_output_tokens": 0}, {"max_output_tokens": -3}, {"max_output_tokens": "many"},
    {"max_output_tokens": 1.5}, {"max_output_tokens": 10**30}, {"max_tokens": True},
    {"temperature": 3}, {"temperature": "hot"}, {"speed": 0}, {"speed": "fast"}, {"idle_timeout_s": 0},
    {"audio": "x"}, {"audio": {"input": []}}, {"audio": {"output": {"speed": [1]}}},
    {"instructions": 5}, {"metadata": "m"}, {"tools": "all"}, {"include": [1]}, {"extra_body": []},
    {"input_audio_transcription": "whisper"}, {"sample_rate_hz": "16k"}, {"overlap_short_ack_ms": -1},
])
def test_wrong_types_and_values_are_refused_naming_the_field(session: dict) -> None:
    problem = error(session)
    field = next(iter(session))
    assert problem.code == "bad_event" and problem.param.split(".")[0] == field, problem.message


def test_overlap_policy_derives_interrupt_response() -> None:
    config = update({"turn_detection": {"type": "server_vad"}, "overlap_policy": "barge_in_on_speech"})
    assert config.turn_detection.interrupt_response is True and config.overlap_policy == "barge_in_on_speech"
    assert error({"overlap_policy": "barge_in_on_speech"}).code == "unsupported_turn_detection"
    conflict = error({"turn_detection": {"type": "server_vad", "interrupt_response": False},
                      "overlap_policy": "barge_in_on_speech"})
    assert "conflicts" in conflict.message


@pytest.mark.parametrize(("session", "code", "param"), [
    ({"model": "other"}, "model_not_found", "model"),
    ({"type": "transcription"}, "bad_event", "session.type"),
    ({"input_audio_format": "mp3"}, "unsupported_audio_format", "audio.input.format"),
    ({"output_audio_format": "pcm_f32le"}, "unsupported_audio_format", "audio.output.format"),
    ({"sample_rate_hz": 4000}, "bad_event", "sample_rate_hz"),
    ({"sample_rate_hz": 16000.5}, "bad_event", "sample_rate_hz"),
    ({"turn_detection": "on"}, "unsupported_turn_detection", "turn_detection"),
    ({"turn_detection": {"type": "semantic_vad", "threshold": 0.5}}, "unsupported_turn_detection", "turn_detection"),
    ({"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}, "invalid_value", "turn_detection.eagerness"),
    ({"turn_detection": {"type": "server_vad", "eagerness": "high"}}, "unsupported_turn_detection",
     "turn_detection"),
    ({"turn_detection": {"type": "server_vad", "threshold": 0.1}}, "unsupported_turn_detection", "turn_detection"),
    ({"turn_detection": {"type": "server_vad", "silence_duration_ms": -1}}, "unsupported_turn_detection",
     "turn_detection"),
    ({"voice": {"id": "custom"}}, "bad_event", "audio.output.voice"),
    ({"extra_body": {"auto_response": True}}, "invalid_duplex_runtime_config", "extra_body"),
])
def test_rejections(session: dict, code: str, param: str) -> None:
    problem = error(session)
    assert (problem.code, problem.param) == (code, param)


def test_each_rejected_group_is_reported_once_in_validation_order() -> None:
    result = applied({"turn_detection": {"type": "push_to_talk"}, "input_audio_format": "mp3", "temperature": "hot",
                      "tools": [{"type": "web_search"}], "output_audio_format": "mp3"})
    assert [(p.code, p.param) for p in result.rejected] == [
        ("bad_event", "temperature"), ("unsupported_audio_format", "audio.input.format"),
        ("unsupported_audio_format", "audio.output.format"), ("unsupported_turn_detection", "turn_detection"),
        ("invalid_value", "session.tools[0].type")]
    assert result.config == fresh() and not result.updated


@pytest.mark.parametrize(("eagerness", "silence_ms"), [("low", 8000), ("medium", 4000), ("auto", 4000), ("high", 2000)])
def test_semantic_vad_waits_at_most_by_eagerness_and_echoes_as_ga(eagerness: str, silence_ms: int) -> None:
    config = update({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": eagerness,
                                                            "interrupt_response": True}}}})
    td = config.turn_detection
    assert (td.type, td.silence_duration_ms, td.interrupt_response, td.create_response) == \
        ("semantic_vad", silence_ms, True, True)
    echoed = session_object(config, {})["audio"]["input"]["turn_detection"]
    assert (echoed["type"], echoed["eagerness"]) == ("semantic_vad", eagerness)


@pytest.mark.parametrize(("bad", "code", "param"), [
    ({"turn_detection": {"type": "push_to_talk"}}, "unsupported_turn_detection", "turn_detection"),
    ({"input_audio_format": {"type": "audio/mp3"}}, "unsupported_audio_format", "audio.input.format"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "nope"}}]}, "invalid_value",
     "session.tools"),
    ({"tool_choice": {"type": "function"}}, "invalid_value", "session.tool_choice"),
    ({"temperature": "hot"}, "bad_event", "temperature"),
    ({"extra_body": {"auto_response": True}}, "invalid_duplex_runtime_config", "extra_body"),
])
def test_a_mixed_update_applies_the_valid_groups_and_reports_the_bad_one(bad: dict, code: str, param: str) -> None:
    current = update({"turn_detection": {"type": "server_vad"}, "tools": [WEATHER]})
    result = applied({"instructions": "Be brief.", "audio": {"output": {"voice": "ethan"}}, **bad}, current)
    assert [(p.code, p.param) for p in result.rejected] == [(code, param)] and result.updated
    assert result.accepted == ["instructions", "voice"]
    assert (result.config.instructions, result.config.voice) == ("Be brief.", "ethan")
    assert result.config.model_copy(update={"instructions": None, "voice": None}) == current


def test_dependent_settings_are_rejected_together() -> None:
    result = applied({"input_audio_format": "mp3", "sample_rate_hz": 48000, "output_audio_format": "g711_ulaw"})
    assert [p.param for p in result.rejected] == ["audio.input.format"]
    assert result.config.input_format == fresh().input_format and result.config.output_format.name == "g711_ulaw"
    result = applied({"turn_detection": {"type": "server_vad"}, "overlap_policy": "barge_in_on_speech",
                      "extra_body": {"auto_response": True, "note": 1}})
    assert [p.code for p in result.rejected] == ["invalid_duplex_runtime_config"]
    assert result.config.turn_detection is None and result.config.extra_body == {"note": 1}


def test_a_type_error_of_an_object_rejects_every_group_inside_it_once() -> None:
    result = applied({"audio": {"input": []}, "turn_detection": {"type": "server_vad"}, "instructions": "x"})
    assert [p.param for p in result.rejected] == ["audio.input"] and result.accepted == ["instructions"]
    assert result.config.turn_detection is None


def test_a_fully_invalid_update_changes_nothing() -> None:
    current = update({"instructions": "keep", "voice": "ethan"})
    problem = error({"voice": {"id": "custom"}, "input_audio_format": "mp3", "idle_timeout_s": -1,
                     "overlap_short_ack_ms": -1}, current)
    assert (problem.code, problem.param) == ("bad_event", "idle_timeout_s")


def test_only_a_transcription_session_is_refused_whole() -> None:
    problem = error({"type": "transcription", "instructions": "x", "voice": "ethan"})
    assert (problem.code, problem.param) == ("bad_event", "session.type")
    assert [p.param for p in applied({"type": "transcription", "temperature": 9}).rejected] == \
        ["temperature", "session.type"]
