"""semantic_vad (docs/realtime-api.md §2.4.2): real Silero finds speech and pauses, the real
Smart Turn v3.2 model judges whether the speech before a pause sounds finished, and eagerness
sets the pauses. Appends are paced so that each verdict is in before more audio arrives, as
with a live client."""

from __future__ import annotations

import asyncio
import wave

import numpy as np
import pytest

from tests.scripted_engine import audio_fixture_path, speech_appends, turn_session
from vllm_omni.audio.end_of_turn import FINISHED_PROBABILITY, EndOfTurnModel
from vllm_omni.audio.silero_vad import SileroModel, VadConfig, VadDetector, samples_to_ms
from vllm_omni.session.base import SessionOptions

# Silero's speech ends (ms), tests/data/README.md
SPEECH_ENDS_MS = {"speech_en_two_turns.wav": [2334, 6174], "speech_with_pause.wav": [3646],
                  "speech_en_long.wav": [12126], "speech_en_single.wav": [3678]}
LONG_SPEECH_PAUSE_MS = (4500, 5000)  # a breath inside speech_en_long.wav's continuous speech

def turn_detection(td: dict) -> dict:
    return {"type": "session.update", "session": {"audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {**td, "create_response": False}}}}}


def semantic_vad(eagerness: str) -> dict:
    return turn_detection({"type": "semantic_vad", "eagerness": eagerness})


async def paced(session, appends: list[dict]) -> None:
    """Append one chunk at a time, letting any end-of-turn verdict land before the next."""
    for ev in appends:
        await session.handle(ev)
        judgement = session.input._judgement
        if judgement is not None:
            await asyncio.wait_for(asyncio.shield(judgement), 10)


async def turn_ends(td: dict, fixture: str, trailing_silence_s: float = 1.5,
                    options: SessionOptions | None = None) -> tuple[list[int], list[str]]:
    """Where each turn ended (speech_stopped audio_end_ms) and the error codes sent."""
    session, _, events = turn_session(options=options)
    await session.handle(turn_detection(td) if td.get("type") == "server_vad" else semantic_vad(td["eagerness"]))
    await paced(session, speech_appends(fixture, trailing_silence_s=trailing_silence_s))
    await session.close()
    assert len(events.of("input_audio_buffer.committed")) == len(events.of("input_audio_buffer.speech_stopped"))
    return [e["audio_end_ms"] for e in events.of("input_audio_buffer.speech_stopped")], events.errors()


def read_fixture(name: str) -> np.ndarray:
    with wave.open(str(audio_fixture_path(name))) as wav:
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.float32) / 32768


def pauses(name: str, pause_check_ms: float) -> list[int]:
    """Where Silero reports each pause in a recording (appended 100 ms at a time) first
    reaching `pause_check_ms` (a pause stopping at 1.5 × that is not checked again)."""
    audio = read_fixture(name)
    detector = VadDetector(SileroModel.load(), VadConfig(silence_duration_ms=1.5 * pause_check_ms,
                                                         pause_check_ms=pause_check_ms))
    found = [detector.feed(audio[i:i + 1600]).pause_sample for i in range(0, audio.size, 1600)]
    return [p for p in found if p is not None]


def test_the_model_tells_a_breath_inside_speech_from_the_end_of_a_question() -> None:
    model = EndOfTurnModel.load()
    long_speech, questions = read_fixture("speech_en_long.wav"), read_fixture("speech_en_two_turns.wav")
    breath, _ = pauses("speech_en_long.wav", 200)
    assert LONG_SPEECH_PAUSE_MS[0] < samples_to_ms(breath) < LONG_SPEECH_PAUSE_MS[1]
    assert model.finished_probability(long_speech[:breath]) < FINISHED_PROBABILITY
    for end in pauses("speech_en_two_turns.wav", 200):  # "…can you hear me okay?" / "…about the ocean."
        assert model.finished_probability(questions[:end]) > FINISHED_PROBABILITY


async def test_high_eagerness_ends_finished_turns_sooner_than_low() -> None:
    ends = {}
    for eagerness in ("high", "medium", "low"):
        ends[eagerness], errors = await turn_ends({"eagerness": eagerness}, "speech_en_two_turns.wav")
        assert len(ends[eagerness]) == 2 and not errors
    for turn, speech_end in enumerate(SPEECH_ENDS_MS["speech_en_two_turns.wav"]):
        high, medium, low = (ends[e][turn] for e in ("high", "medium", "low"))
        # finished sentences end at the short pause, far from the 2 s / 8 s an unfinished one waits
        assert speech_end < high < medium < low < speech_end + 1000 and high - speech_end < 500


@pytest.mark.parametrize("eagerness", ["medium", "low"])
async def test_a_mid_sentence_pause_does_not_end_the_turn(eagerness: str) -> None:
    ends, errors = await turn_ends({"eagerness": eagerness}, "speech_with_pause.wav")
    assert not errors and len(ends) == 1 and ends[0] > SPEECH_ENDS_MS["speech_with_pause.wav"][0]


async def test_a_pause_the_model_hears_as_unfinished_does_not_end_the_turn() -> None:
    """speech_en_long: silence alone (server_vad with high eagerness's 200 ms) ends a turn at
    its breath; semantic_vad, even at high eagerness, keeps listening."""
    ends, _ = await turn_ends({"type": "server_vad", "silence_duration_ms": 200}, "speech_en_long.wav")
    assert len(ends) >= 2 and LONG_SPEECH_PAUSE_MS[0] < ends[0] < LONG_SPEECH_PAUSE_MS[1]
    ends, errors = await turn_ends({"eagerness": "high"}, "speech_en_long.wav", trailing_silence_s=2.5)
    assert not errors and len(ends) == 1 and ends[0] > SPEECH_ENDS_MS["speech_en_long.wav"][0]


async def test_without_the_model_turns_end_at_the_longest_pause() -> None:
    options = SessionOptions(served_models=["tiny"], end_of_turn_model_path="/nonexistent/smart-turn.onnx")
    ends, errors = await turn_ends({"eagerness": "high"}, "speech_en_single.wav", trailing_silence_s=2.5,
                                   options=options)
    assert errors == ["server_vad_unavailable"]
    assert len(ends) == 1 and ends[0] >= SPEECH_ENDS_MS["speech_en_single.wav"][0] + 1900


def test_a_pause_is_checked_again_as_it_grows() -> None:
    """At the check length, then twice and four times as long… until speech comes back."""
    audio = np.concatenate([read_fixture("speech_en_single.wav"), np.zeros(16000 * 2, np.float32)])
    detector = VadDetector(SileroModel.load(), VadConfig(silence_duration_ms=8000, pause_check_ms=200))
    reports = [detector.feed(audio[i:i + 512]).pause_sample for i in range(0, audio.size, 512)]
    last_pause = [samples_to_ms(p) for p in reports if p is not None][-5:]  # 3.4 s of silence at the end
    gaps = [later - earlier for earlier, later in zip(last_pause, last_pause[1:], strict=False)]
    assert gaps == pytest.approx([200, 400, 800, 1600], abs=40)
    assert detector.pause_is_current(16 * last_pause[0]) and detector.in_speech
