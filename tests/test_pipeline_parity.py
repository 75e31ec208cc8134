"""The staged pipeline equals transformers' `generate(return_audio=True)` on the tiny checkpoint.

Thinker token ids and talker codec ids must be identical, and the streamed PCM16 within
one LSB of a one-shot code2wav decode of all codes, with async_chunk on and off and for
several code2wav chunk settings.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from tests.conftest import read_fixture_pcm
from tests.engine_helpers import make_engine, run_request
from tests.hf_reference import cached_reference, hf_generate, hf_messages
from vllm_omni.audio.pcm import float_to_pcm16
from vllm_omni.engine import Message, OmniRequest

THINKER_TOKENS = 24
TALKER_TOKENS = 60

# (role, text, audio fixture) per turn.
CASES = {
    "text": [("user", "Tell me a story about the sea.", None)],
    "audio": [("user", None, "speech_en_single.wav")],
    "two_turns": [("system", "You are a helpful voice assistant.", None),
                  ("user", None, "speech_en_single.wav"),
                  ("assistant", "It is sunny in Paris today.", None),
                  ("user", "And tomorrow?", "speech_with_pause.wav")],
}
SETTINGS = {  # (async_chunk, first chunk frames, later chunk frames)
    "async-1-1": (True, 1, 1),
    "async-4-25": (True, 4, 25),
    "async-25-25": (True, 25, 25),
    "sync": (False, 4, 25),
}


def engine_request(case: str) -> OmniRequest:
    messages = [Message(role, text=text, audio=read_fixture_pcm(audio) if audio else None)
                for role, text, audio in CASES[case]]
    return OmniRequest(messages, speaker="Ethan",
                       sampling={"thinker": {"max_tokens": THINKER_TOKENS},
                                 "talker": {"max_tokens": TALKER_TOKENS}})


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    """transformers' own generate, on its own copy of the checkpoint; cached per case."""
    return cached_reference(tiny_checkpoint, reference_run)


def reference_run(model, processor, case: str) -> dict:
    messages, audios = hf_messages([(role, text, 0, audio) for role, text, audio in CASES[case]])
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=prompt, audio=audios or None, return_tensors="pt")
    sequences, waveform, codes = hf_generate(model, inputs, speaks=True, thinker_tokens=THINKER_TOKENS,
                                             talker_tokens=TALKER_TOKENS)
    with torch.no_grad():
        one_shot = model.code2wav(codes[None].to(model.device)).reshape(-1).cpu().numpy()
    return {"tokens": sequences[0, inputs["input_ids"].shape[1]:].tolist(),
            "codes": codes.numpy(), "one_shot_pcm": float_to_pcm16(one_shot).astype(np.int32),
            "hf_pcm": float_to_pcm16(waveform.reshape(-1).numpy()).astype(np.int32)}


@pytest.fixture(scope="module")
def engines(tiny_loaded):
    built = {name: make_engine(tiny_loaded, async_chunk=a, first=f, later=lt)
             for name, (a, f, lt) in SETTINGS.items()}
    yield built
    for engine in built.values():
        engine.shutdown()


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("case", list(CASES))
def test_equals_transformers_generate(case: str, setting: str, reference, engines) -> None:
    expected = reference(case)
    ours = asyncio.run(run_request(engines[setting], engine_request(case)))
    final = ours["final"]
    assert final.finish_reason in ("stop", "length") and final.error is None
    assert list(final.token_ids) == expected["tokens"]
    assert ours["codes"].shape == expected["codes"].shape
    assert np.array_equal(ours["codes"], expected["codes"])
    assert expected["codes"].shape[1] < 300  # transformers' waveform is one-shot below 300 frames
    for reference_pcm in (expected["one_shot_pcm"], expected["hf_pcm"]):
        assert ours["pcm"].shape == reference_pcm.shape
        assert np.abs(ours["pcm"] - reference_pcm).max() <= 1
    assert np.abs(ours["pcm"]).max() > 100  # real signal, not silence


def test_chunk_sizes_follow_the_connector(engines) -> None:
    ours = asyncio.run(run_request(engines["async-4-25"], engine_request("text")))
    samples = [len(c.pcm16) // 2 for c in ours["chunks"]]
    # 4 frames minus the decoder's 555-sample look-ahead, then chunks growing by half the
    # frames sent so far (ramp_codec_chunks), up to 25 frames per chunk.
    frames = [4, 4, 4, 6, 9, 13, 20] + [25] * len(samples)
    assert samples[0] == 4 * 1920 - 555
    assert samples[1:-1] == [n * 1920 for n in frames[1:len(samples) - 1]]
    assert len(samples) > 4  # the ramp was exercised
    sync = asyncio.run(run_request(engines["sync"], engine_request("text")))
    assert len(sync["chunks"]) == 1
    assert sync["pcm"].shape == ours["pcm"].shape
    assert np.abs(sync["pcm"] - ours["pcm"]).max() <= 1
