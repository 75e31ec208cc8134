"""MiniCPM-o's duplex loop in torch on the tiny checkpoint (white-box): the context grows unit by
unit with the real layout, listen and speak units, the talker's codes per speaking unit, turn
ends, forced listens mid-turn, and the model hears its input."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from tests.conftest import read_fixture_pcm
from vllm_omni.models.minicpmo.mel_stream import unit_close_samples
from vllm_omni.models.minicpmo.talker import TalkerSampling
from vllm_omni.models.minicpmo.torch_thinker import TorchDuplexThinker
from vllm_omni.models.minicpmo.unit_decoder import UnitSampling


@pytest.fixture(scope="module")
def thinker(minicpmo_checkpoint: Path) -> TorchDuplexThinker:
    return TorchDuplexThinker(minicpmo_checkpoint, UnitSampling(temperature=0.0),
                              TalkerSampling(temperature=0.0, repetition_penalty=1.0))


def speech(units: int) -> np.ndarray:
    return read_fixture_pcm("speech_en_long.wav")[: unit_close_samples(units - 1)]


def test_listen_units_grow_the_context_by_13(thinker: TorchDuplexThinker) -> None:
    session = thinker.start()
    assert thinker.schema(session) == ["<|im_start|>system\nStreaming Omni Conversation.\n", "<|im_end|>"]
    start = session.positions
    results = thinker.append_audio(session, speech(3), script="listen")
    assert [r.listened for r in results] == [True] * 3 and all(r.codes == [] for r in results)
    assert session.positions - start == 3 * 13  # <unit>, 10 audio rows, <|listen|>, </unit>
    assert thinker.schema(session)[2:] == ["<unit>", "[audio×10]", "<|listen|></unit>"] * 3


def test_speaking_units_feed_the_talker_and_a_turn_end_resets_it(thinker: TorchDuplexThinker) -> None:
    session = thinker.start()
    audio = speech(4)
    first, second = thinker.append_audio(session, audio[: unit_close_samples(1)], script="speak")
    for unit in (first, second):
        assert unit.spoke and unit.tokens[-1] == thinker.ids.chunk_eos and len(unit.tokens) <= 20
        assert len(unit.text) < 28 and unit.text
    assert len(second.codes) == 25 and not second.ended_turn
    assert session.talker_turn.units == 2
    (ending,) = thinker.append_audio(session, audio[unit_close_samples(1): unit_close_samples(2)], script="speak_end")
    assert ending.ended_turn and ending.tokens[-2:] == [thinker.ids.turn_eos, thinker.ids.listen]
    assert len(ending.codes) <= 25 and session.talker_turn.position == 0  # the talker starts over
    (after,) = thinker.append_audio(session, audio[unit_close_samples(2):], script="listen")
    assert after.listened


def test_a_forced_listen_mid_turn_closes_the_turn_in_the_context(thinker: TorchDuplexThinker) -> None:
    session = thinker.start()
    audio = speech(2)
    thinker.append_audio(session, audio[: unit_close_samples(0)], script="speak")
    (forced,) = thinker.append_audio(session, audio[unit_close_samples(0):], forced_listen=True, script="speak")
    assert forced.tokens == [thinker.ids.turn_eos, thinker.ids.listen] and forced.ended_turn
    assert thinker.schema(session)[-2:] == ["<|turn_eos|>", "<|listen|></unit>"]


def test_a_text_seeded_session_opens_with_the_users_turn_and_the_models_turn_open(
        thinker: TorchDuplexThinker) -> None:
    session = thinker.start(user_text="Hello there")
    assert thinker.schema(session) == ["<|im_start|>system\nStreaming Omni Conversation.\n", "<|im_end|>\n"
                                       "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"]
    (forced,) = thinker.append_audio(session, np.zeros(unit_close_samples(0), dtype=np.float32), forced_listen=True)
    assert forced.tokens == [thinker.ids.turn_eos, thinker.ids.listen]  # the open turn is closed first


def test_the_model_hears_its_input(thinker: TorchDuplexThinker) -> None:
    texts = {}
    for name, samples in (("speech", speech(1)), ("silence", np.zeros(unit_close_samples(0), dtype=np.float32)),
                          ("noise", read_fixture_pcm("noise_only.wav")[: unit_close_samples(0)])):
        (unit,) = thinker.append_audio(thinker.start(), samples, script="speak")
        texts[name] = unit.tokens
    assert len({tuple(tokens) for tokens in texts.values()}) == 3, texts


def test_the_same_input_gives_the_same_unit(thinker: TorchDuplexThinker) -> None:
    runs = [thinker.append_audio(thinker.start(), speech(2), script="speak") for _ in range(2)]
    assert [(u.tokens, u.codes) for u in runs[0]] == [(u.tokens, u.codes) for u in runs[1]]
    assert torch.tensor(runs[0][1].codes).numel() == 25


def picture(color: tuple[int, int, int], size: tuple[int, int] = (640, 480)) -> bytes:
    out = io.BytesIO()
    image = Image.new("RGB", size, color)
    ImageDraw.Draw(image).ellipse((100, 100, 300, 300), fill=(255 - color[0], 200, 30))
    image.save(out, "JPEG")
    return out.getvalue()


def test_a_frame_is_an_image_block_before_the_units_audio(thinker: TorchDuplexThinker) -> None:
    session = thinker.start()
    audio = speech(3)
    thinker.append_audio(session, audio[:4000], frames=[picture((20, 40, 200))], script="listen")  # closes no unit
    start = session.positions
    thinker.append_audio(session, audio[4000: unit_close_samples(0)], script="listen")
    assert thinker.schema(session)[-6:] == ["<unit>", "<image>", "[image×64]", "</image>", "[audio×10]",
                                            "<|listen|></unit>"]
    assert session.positions - start == 13 + 66  # the frame block: <image>, 64 rows, </image>
    thinker.append_audio(session, audio[unit_close_samples(0): unit_close_samples(1)], script="listen")
    assert thinker.schema(session)[-3:] == ["<unit>", "[audio×10]", "<|listen|></unit>"]  # a unit without frames


def test_the_model_looks_at_its_frames(thinker: TorchDuplexThinker) -> None:
    tokens = []
    for color in ((20, 40, 200), (230, 230, 20)):
        (unit,) = thinker.append_audio(thinker.start(), speech(1), frames=[picture(color)], script="speak")
        tokens.append(unit.tokens)
    assert tokens[0] != tokens[1]

