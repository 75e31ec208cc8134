"""Seeded generator of hostile client traffic for the realtime fuzz test.

Each mutated event is a well-formed event of a known type with ONE field set to a value
its type (as the protocol docs define it, written out here independently of the server's
models) does not allow, and a unique `event_id`, so the test can demand an `error` naming
that event for each of them. Raw frames (broken JSON, NaN, lone surrogates, deep nesting,
binary, huge strings) carry no usable event id and are counted instead.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

SILENCE_100MS = base64.b64encode(b"\0\0" * 1600).decode()

# Kinds of field values: S string, B bool, I integer, N non-negative number, O object,
# R any number, L list, F audio format (string or object), E one of a few strings.
BASES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "session.update": ({"session": {}}, {
        "session": "O", "session.instructions": "S", "session.modalities": "L", "session.output_modalities": "L",
        "session.audio": "O", "session.audio.input": "O", "session.audio.output": "O",
        "session.audio.input.format": "F", "session.audio.output.format": "F", "session.input_audio_format": "F",
        "session.output_audio_format": "F", "session.turn_detection": "O", "session.audio.input.turn_detection": "O",
        "session.voice": "S", "session.audio.output.voice": "S", "session.speed": "N",
        "session.audio.output.speed": "N",
        "session.max_output_tokens": "I", "session.max_response_output_tokens": "I", "session.temperature": "N",
        "session.tools": "L", "session.metadata": "O", "session.include": "L",
        "session.prompt": "O", "session.idle_timeout_s": "N", "session.extra_body": "O",
        "session.input_audio_transcription": "O", "session.audio.input.noise_reduction": "O",
        "session.sample_rate_hz": "I", "session.model": "S", "session.type": "E",
    }),
    "input_audio_buffer.append": ({"audio": SILENCE_100MS}, {
        "audio": "S", "sample_rate_hz": "I", "input_audio_format": "F", "is_speech": "B", "speech_probability": "N",
        "duration_ms": "N", "audio_end_ms": "N", "transcript": "S", "force_barge_in": "B", "force_listen": "B",
        "vad": "O", "overlap_action": "S",
    }),
    "input_audio_buffer.commit": ({}, {"create_response": "B", "final": "B", "is_speech": "B"}),
    "conversation.item.create": ({"item": {"type": "message", "role": "user",
                                           "content": [{"type": "input_text", "text": "hi"}]}}, {
        "item": "O", "previous_item_id": "S", "item.id": "S", "item.type": "E", "item.role": "E",
        "item.content": "L", "item.content.0": "O", "item.content.0.type": "E", "item.content.0.text": "S",
    }),
    "conversation.item.delete": ({"item_id": "item_x"}, {"item_id": "S"}),
    "conversation.item.retrieve": ({"item_id": "item_x"}, {"item_id": "S"}),
    "conversation.item.truncate": ({"item_id": "item_x", "content_index": 0, "audio_end_ms": 0}, {
        "item_id": "S", "content_index": "I", "audio_end_ms": "N"}),
    "response.create": ({"response": {}}, {
        "response": "O", "response.instructions": "S", "response.max_output_tokens": "I",
        "response.temperature": "N", "response.conversation": "E", "response.metadata": "O",
        "response.output_modalities": "L", "response.voice": "S", "response.tools": "L",
    }),
    "response.cancel": ({}, {"response_id": "S"}),
    "output_audio_buffer.clear": ({}, {"response_id": "S"}),
    "playback.ack": ({"played_ms": 0}, {"response_id": "S", "item_id": "S", "played_ms": "R", "committed_ms": "R",
                                        "truncate": "B"}),
    "session.close": ({}, {"reason": "S"}),
    "input.text.append": ({"text": "x"}, {"text": "S"}),
    "session.heartbeat": ({}, {"event_id": "S"}),
}

BAD_VALUES: dict[str, list[Any]] = {
    "S": [5, 1.5, True, [], {}, ["a"], {"a": 1}],
    "B": ["true", 1, 0, 1.5, [], {}],
    "I": ["5", 1.5, True, [], {}, 10**30, -1, 0],
    "N": ["1", True, [], {}, -1, -0.5],
    "R": ["1", True, [], {}, "0"],
    "O": ["x", 5, [], True, 1.5],
    "L": ["x", 5, {}, True],
    "F": [5, True, [], "mp3", {"type": "audio/mp3"}, {"type": 5}],
    "E": [5, True, [], {}, "not-a-valid-choice"],
}


def _set_path(event: dict[str, Any], path: str, value: Any) -> None:
    node: Any = event
    parts = path.split(".")
    for part in parts[:-1]:
        key: Any = int(part) if isinstance(node, list) else part
        if isinstance(node, dict) and key not in node:
            node[key] = {}
        node = node[key]
    last = parts[-1]
    node[int(last) if isinstance(node, list) else last] = value


def mutated_event(rng: random.Random, event_id: str) -> dict[str, Any]:
    """A known event with one field of the wrong type or range."""
    kind = rng.choice(sorted(BASES))
    base, fields = BASES[kind]
    event = json.loads(json.dumps({"type": kind, **base}))
    path = rng.choice(sorted(fields))
    _set_path(event, path, rng.choice(BAD_VALUES[fields[path]]))
    if path != "event_id":
        event["event_id"] = event_id
    return event


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def raw_frame(rng: random.Random) -> str | bytes:
    """A frame that is not a valid event at all: each must get one `error` (no event id)."""
    choices: list[str | bytes] = [
        "{not json", "", "[1, 2]", "42", "null", '"text"', '{"type": 5}', '{"no_type": true}',
        '{"type": "input_audio_buffer.append", "audio": NaN}',
        '{"type": "session.update", "session": {"temperature": Infinity}}',
        '{"type": "session.update", "session": {"instructions": "\\ud800"}}',
        '{"type": "\\udfff"}',
        '{"type": "conversation.item.create", "item": {"content": [{"type": "input_text", "text": "a\\ud83d"}]}}',
        '{"type": "session.update", "session": {"metadata": {"x": ' + _deep(100) + "}}}",
        _deep(5000),
        '{"type": "' + "x" * 200_000 + '"}',
        '{"type": "session.update", "session": {"temperature": 1e400}}',
        '{"type": "session.update", "session": {"max_output_tokens": ' + "9" * 5000 + "}}",
        b"\x00\x01binary",
        json.dumps({"type": "input_audio_buffer.frobnicate"}),
    ]
    return rng.choice(choices)
