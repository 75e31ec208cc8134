"""How a Moshi frame becomes a unit decision (docs/moshi.md, "Frames on the wire"): padding
text over quiet speech listens, anything else speaks, a pause inside a turn keeps its audio, and
END_OF_TURN_FRAMES quiet frames in a row end the turn; a forced frame listens and closes a turn
it interrupts; scripted frames speak whatever they hold. The tiny checkpoint's random model is
never quiet, so the rule is driven here with frames made to order."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_omni.audio.pcm import float_to_pcm16_bytes
from vllm_omni.models.moshi.frame_loop import Frame
from vllm_omni.models.moshi.text import EPAD_ID, PAD_ID
from vllm_omni.models.moshi.unit_model import END_OF_TURN_FRAMES, MoshiUnitSession

LOUD = 0.1 * np.sin(np.arange(1920) / 5.0).astype(np.float32)
QUIET = np.full(1920, 1e-4, np.float32)  # -80 dBFS


def frame(token: int, audio: np.ndarray) -> Frame:
    return Frame(token, (0,) * 8, audio, 1.0)


@pytest.fixture
def session(moshi_engine) -> MoshiUnitSession:
    return MoshiUnitSession(moshi_engine.model, state=None, wants_audio=True, script=())


def test_padding_over_quiet_speech_listens_and_words_speak(session) -> None:
    assert not session._decision(frame(PAD_ID, QUIET), False, None).spoke
    assert not session._decision(frame(EPAD_ID, QUIET), False, None).spoke
    said = session._decision(frame(1234, QUIET), False, None)
    assert (said.spoke, said.text, said.audio) == (True, " t1234", float_to_pcm16_bytes(QUIET))
    assert session._decision(frame(PAD_ID, LOUD), False, None).spoke  # speech without a word is speech


def test_a_pause_keeps_its_audio_and_a_long_one_ends_the_turn(session) -> None:
    session._decision(frame(1234, LOUD), False, None)
    pause = [session._decision(frame(PAD_ID, QUIET), False, None) for _ in range(END_OF_TURN_FRAMES)]
    assert all(d.spoke and d.text == "" and d.audio for d in pause)
    assert [d.end_of_turn for d in pause] == [False] * (END_OF_TURN_FRAMES - 1) + [True]
    assert not session._decision(frame(PAD_ID, QUIET), False, None).spoke  # then it listens
    session._decision(frame(1234, LOUD), False, None)
    short = [session._decision(frame(PAD_ID, QUIET), False, None) for _ in range(3)]
    assert not any(d.end_of_turn for d in short)
    assert not session._decision(frame(99, LOUD), False, None).end_of_turn  # a word restarts the count


def test_a_forced_frame_listens_and_closes_the_turn_it_interrupts(session) -> None:
    assert not session._decision(frame(1234, LOUD), True, None).end_of_turn  # no turn to close
    session._decision(frame(1234, LOUD), False, None)
    forced = session._decision(frame(1234, LOUD), True, None)
    assert (forced.spoke, forced.end_of_turn, forced.audio) == (False, True, b"")


def test_scripted_frames_speak_whatever_they_hold(session) -> None:
    spoken = session._decision(frame(PAD_ID, QUIET), False, "speak")
    assert spoken.spoke and not spoken.end_of_turn
    ending = session._decision(frame(1234, LOUD), False, "speak_end")
    assert ending.spoke and ending.end_of_turn
    assert not session._decision(frame(PAD_ID, QUIET), False, None).spoke  # the turn is over
