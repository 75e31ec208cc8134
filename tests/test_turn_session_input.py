"""Input buffering limits of a turn session (unit level: the engine is never called here)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_omni.engine.request import AudioInputStream
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.session_config import SessionConfig, TurnDetection
from vllm_omni.session.base import SessionOptions
from vllm_omni.session.factory import ga_session
from vllm_omni.session.input_track import MAX_PENDING_INPUT_BYTES
from vllm_omni.session.session import Session


class StreamsOnly:
    """Stands in for the engine: these tests only buffer input, they never generate."""

    speakers = ["ethan"]

    @staticmethod
    def create_audio_stream() -> AudioInputStream:
        return AudioInputStream()


def session(turn_detection: TurnDetection | None) -> tuple[Session, list[dict]]:
    events: list[dict] = []
    config = SessionConfig(id="sess_test", model="tiny", turn_detection=turn_detection)
    return ga_session(StreamsOnly(), config, SessionOptions(served_models=["tiny"]), events.append), events


def test_silence_under_server_vad_does_not_pile_up() -> None:
    turn, events = session(TurnDetection())
    for _ in range(300):  # 30 s of silence in 100 ms appends
        turn.input.accept(np.zeros(1600, np.float32))
    assert turn.input.pending.size < 16000  # under a second is kept
    assert turn.input.timeline == 300 * 1600
    assert not [e for e in events if e["type"].startswith("input_audio_buffer.speech")]


def test_uncommitted_input_without_vad_is_capped() -> None:
    turn, _ = session(None)
    chunk = np.zeros(16000 * 60, np.float32)  # a minute at a time
    appended = 0
    with pytest.raises(ProtocolError) as refused:
        while True:
            turn.input.accept(chunk)
            appended += chunk.size
    assert refused.value.code == "input_backpressure"
    assert appended * 4 <= MAX_PENDING_INPUT_BYTES
    assert turn.input.pending.size == appended  # the refused append changed nothing


def test_sample_buffer_views_drops_and_takes_across_chunks() -> None:
    from vllm_omni.audio.sample_buffer import SampleBuffer

    buffer = SampleBuffer(start=100)
    for piece in np.split(np.arange(100, 130, dtype=np.float32), [7, 8, 20]):
        buffer.append(piece)
    assert (buffer.start, buffer.end) == (100, 130)
    assert buffer.view(105, 125).tolist() == list(range(105, 125))
    buffer.drop_until(110)
    assert buffer.start == 110 and buffer.view(0, 10**6).tolist() == list(range(110, 130))
    assert buffer.take_until(121).tolist() == list(range(110, 121))
    assert (buffer.start, buffer.size) == (121, 9)
    buffer.drop_until(500)
    assert (buffer.start, buffer.size) == (500, 0)
