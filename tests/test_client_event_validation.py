"""Frame decoding and client-event validation (unit level): whatever a frame holds, the
result is a parsed event or a ProtocolError naming what is wrong, never another exception."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_omni.engine.request import AudioInputStream
from vllm_omni.protocol.client_events import parse_client_event
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.frames import MAX_NESTING, decode_client_frame
from vllm_omni.session.conversation import Conversation, Item, prompt_messages

FRAMES = [
    ("{not json", "invalid_json"),
    ('{"type": "x", "v": NaN}', "invalid_json"),
    ('{"type": "x", "v": -Infinity}', "invalid_json"),
    ('{"type": "x", "v": 1e999}', "invalid_json"),
    ('{"type": "x", "v": ' + "9" * 5000 + "}", "invalid_json"),
    ('{"type": "x", "v": "\\ud800"}', "invalid_json"),
    ('{"type": "x", "\\udc00": 1}', "invalid_json"),
    ('{"type": "x", "v": ' + "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1) + "}", "bad_event"),
    ("[" * 100_000 + "]" * 100_000, "bad_event"),
    ("[1]", "bad_event"),
    ('{"type": 1}', "bad_event"),
]


@pytest.mark.parametrize(("frame", "code"), FRAMES)
def test_bad_frames_are_protocol_errors(frame: str, code: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        decode_client_frame(frame)
    assert refused.value.code == code


def test_surrogate_pairs_and_nesting_within_the_limit_are_fine() -> None:
    assert decode_client_frame('{"type": "x", "v": "\\ud83d\\ude00"}')["v"] == "\N{GRINNING FACE}"
    nested = "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)
    assert decode_client_frame('{"type": "x", "v": ' + nested + "}")["type"] == "x"


@pytest.mark.parametrize(("event", "param"), [
    ({"type": "input_audio_buffer.append", "audio": 5}, "audio"),
    ({"type": "input_audio_buffer.append", "is_speech": "yes"}, "is_speech"),
    ({"type": "input_audio_buffer.commit", "create_response": 1}, "create_response"),
    ({"type": "conversation.item.create", "item": {"content": [{"type": "input_audio", "audio": []}]}},
     "item.content.0.audio"),
    ({"type": "conversation.item.create", "item": {"content": [{"type": "video"}]}}, "item.content.0"),
    ({"type": "conversation.item.create", "item": {"role": "robot"}}, "item.role"),
    ({"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": -1}, "audio_end_ms"),
    ({"type": "response.create", "response": {"max_output_tokens": 10**9}}, "response.max_output_tokens"),
    ({"type": "response.create", "response": {"temperature": 9}}, "response.temperature"),
    ({"type": "response.create", "response": {"conversation": "maybe"}}, "response.conversation"),
    ({"type": "playback.ack", "played_ms": "10"}, "played_ms"),
    ({"type": "session.close", "reason": "x" * 1000}, "reason"),
    ({"type": "session.heartbeat", "event_id": 7}, "event_id"),
])
def test_wrong_types_name_the_field(event: dict, param: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_client_event(json.loads(json.dumps(event)))
    assert (refused.value.code, refused.value.param) == ("bad_event", param)


def test_unknown_keys_are_allowed() -> None:
    assert parse_client_event({"type": "session.heartbeat", "x_trace": {"id": 1}}).type == "session.heartbeat"


def _spoken(item_id: str, seconds: float, text: str | None = None) -> Item:
    stream = AudioInputStream()
    stream.append(np.zeros(int(16000 * seconds), np.float32))
    return Item(id=item_id, role="user", stream=stream, audio_ms=int(seconds * 1000), text=text)


def test_stored_speech_is_capped_oldest_first_and_text_stays() -> None:
    conversation = Conversation()
    for i in range(4):
        conversation.add(_spoken(f"u{i}", 2.0, text="typed" if i == 0 else None))
    dropped = conversation.drop_oldest_audio(max_ms=5000)
    assert [item.id for item in dropped] == ["u0", "u1"]
    assert [item.held_audio_ms for item in conversation.items] == [0, 0, 2000, 2000]
    messages = prompt_messages(None, conversation.items)
    assert [(m.text, m.audio_stream is not None) for m in messages] == [("typed", False), (None, True), (None, True)]
    assert conversation.items[1].to_wire()["content"] == [{"type": "input_audio", "transcript": ""}]


def test_the_newest_turn_keeps_its_speech_even_over_the_cap() -> None:
    conversation = Conversation()
    conversation.add(_spoken("long", 3.0))
    assert conversation.drop_oldest_audio(max_ms=1000) == []
    assert conversation.items[0].held_audio_ms == 3000


def test_a_stream_gives_the_same_features_every_turn() -> None:
    stream = AudioInputStream()
    stream.append(np.random.default_rng(0).standard_normal(3200).astype(np.float32) * 0.1)
    assert np.array_equal(stream.close().numpy(), stream.close().numpy())
