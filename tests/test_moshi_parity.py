"""Moshi's streamed frame loop against transformers' Moshi on the same tiny weights
(docs/moshi.md, "Parity"), at temperature 0.

The reference is transformers' own modules run column by column: `MoshiForConditionalGeneration`
forward with a DynamicCache, `depth_decoder.generate` for each column's codes, Mimi's
whole-sequence `encode` of the user audio and `decode` of the model's codes. With silent user
audio that loop is exactly `generate`; with speech it is what `generate` would do if it heard
the user frame by frame (its own loop hears a prompt, then silence). The streamed loop must give
the same text tokens and codes, and PCM within 1 LSB, however the audio was chunked and
whichever sessions shared its batches.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from transformers import MoshiForConditionalGeneration
from transformers.cache_utils import DynamicCache

from tests.conftest import read_fixture_pcm
from vllm_omni.audio.pcm import MODEL_RATE, StreamingResampler, float_to_pcm16
from vllm_omni.engine.native_duplex import DuplexOpening
from vllm_omni.models.moshi.frame_loop import FrameLoop, Sampling
from vllm_omni.models.moshi.unit_model import UNIT_SAMPLES, MoshiUnitModel

FRAMES = 40  # 3.2 s


@pytest.fixture(scope="module")
def reference(moshi_checkpoint):
    return MoshiForConditionalGeneration.from_pretrained(moshi_checkpoint, dtype=torch.float32).eval()


def codec_input(samples_16k: np.ndarray) -> np.ndarray:
    """The 24 kHz signal the session's Mimi hears: resampled, the resampler's delay as leading zeros."""
    resampler = StreamingResampler(MODEL_RATE, 24000)
    return np.concatenate([np.zeros(resampler.delay, np.float32), resampler.process(samples_16k)])


@torch.inference_mode()
def reference_loop(model: MoshiForConditionalGeneration, user_24k: np.ndarray | None, frames: int):
    """(text tokens, codes [frames, 8], PCM float32) of the model's first `frames` frames."""
    config, cb = model.config, model.config.num_codebooks
    frame = int(config.sampling_rate / config.audio_encoder_config.frame_rate)
    if user_24k is None:  # generate's blank user: one silent frame's codes, every column
        silent = model.audio_encoder.encode(torch.zeros(1, 1, frame), num_quantizers=cb)[0][0, :, 0]
        user = silent.view(cb, 1).expand(cb, frames)
    else:
        user = model.audio_encoder.encode(torch.from_numpy(user_24k[:frames * frame]).view(1, 1, -1),
                                          num_quantizers=cb)[0][0]
    bos = torch.full((cb, 1), config.audio_vocab_size)
    user_columns = torch.cat([bos, torch.cat([user[:1], torch.cat([bos[1:], user[1:, :-1]], 1)])], 1)
    text, moshi = torch.tensor([[config.vocab_size]]), bos
    cache, tokens, columns = DynamicCache(config=config), [], []
    for column in range(frames + 1):
        out = model(input_ids=text, user_audio_codes=user_columns[None, :, column:column + 1],
                    moshi_audio_codes=moshi.view(1, cb, 1), past_key_values=cache, use_cache=True)
        text = out.logits[:, -1].argmax(-1, keepdim=True)
        codes = model.depth_decoder.generate(last_hidden_state=out.last_hidden_state, input_ids=text,
                                             min_length=cb + 1, max_length=cb + 1, do_sample=False,
                                             cache_implementation="static")[0, 1:]
        if column == 0:
            codes = torch.cat([codes[:1], bos[1:, 0]])
        tokens.append(int(text)), columns.append(codes)
        moshi = codes
    stacked = torch.stack(columns, 1)  # [8, frames + 1]: column c holds the prediction for column c + 1
    frame_codes = torch.cat([stacked[:1, :frames], stacked[1:, 1:frames + 1]])
    pcm = model.audio_encoder.decode(frame_codes[None]).audio_values[0, 0].numpy()
    return tokens[:frames], frame_codes.T, pcm


def test_the_reference_loop_is_transformers_generate_on_silence(reference) -> None:
    out = reference.generate(max_new_tokens=13, do_sample=False, depth_decoder_do_sample=False,
                             return_audio_codes=True)
    tokens, codes, pcm = reference_loop(reference, None, 11)
    assert tokens == out.sequences[0, 1:12].tolist()
    assert torch.equal(codes, out.audio_codes[0, :, :11].T)
    assert np.abs(pcm - out.audio_sequences[0, 0, :pcm.size].numpy()).max() * 32768 < 1


def test_the_streamed_loop_matches_transformers_on_speech(reference, moshi_checkpoint) -> None:
    speech = read_fixture_pcm("speech_en_single.wav")[:FRAMES * UNIT_SAMPLES]
    signal = codec_input(speech)
    tokens, codes, pcm = reference_loop(reference, signal, FRAMES)
    assert len(set(tokens)) > 5  # the model's text moves with what it hears
    loop = FrameLoop(reference, slots=2, text=Sampling(), audio=Sampling())
    state = loop.open(seed=0)
    frames = [loop.step([state], [torch.from_numpy(signal[i * 1920:(i + 1) * 1920].copy())], [False])[0]
              for i in range(FRAMES)]
    assert [f.text_token for f in frames] == tokens
    assert [f.codes for f in frames] == [tuple(row) for row in codes.tolist()]
    streamed = np.concatenate([f.audio for f in frames])
    assert np.abs(float_to_pcm16(streamed).astype(int) - float_to_pcm16(pcm[:streamed.size]).astype(int)).max() <= 1


def said(decision) -> tuple:
    return decision.spoke, decision.text, decision.end_of_turn, decision.audio


def test_chunking_and_batching_do_not_change_a_session(moshi_engine) -> None:
    """The same speech in 30 ms and 130 ms appends, and beside another session in the same
    batches, gives the same decisions (PCM within 1 LSB across batch shapes)."""
    model: MoshiUnitModel = moshi_engine.model
    speech = read_fixture_pcm("speech_en_single.wav")[:24 * UNIT_SAMPLES]
    other = read_fixture_pcm("speech_en_two_turns.wav")[:24 * UNIT_SAMPLES]

    async def session_decisions(chunk_ms: int, company: np.ndarray | None):
        opening = DuplexOpening()
        sessions = [await model.open(opening)] + ([await model.open(opening)] if company is not None else [])
        streams = [speech] + ([company] if company is not None else [])
        step = MODEL_RATE * chunk_ms // 1000
        decided = [[] for _ in sessions]

        async def feed(index: int) -> None:
            for start in range(0, streams[index].size, step):
                decided[index] += await sessions[index].append(streams[index][start:start + step], [], False)

        await asyncio.gather(*(feed(i) for i in range(len(sessions))))
        for session in sessions:
            await session.close()
        return decided[0]

    alone_30 = asyncio.run(session_decisions(30, None))
    alone_130 = asyncio.run(session_decisions(130, None))
    steps_before = model.batcher.batch_sizes.copy()
    batched = asyncio.run(session_decisions(130, other))
    assert len(alone_30) == 24 and [said(d) for d in alone_30] == [said(d) for d in alone_130]
    assert [said(d)[:2] for d in batched] == [said(d)[:2] for d in alone_30]
    for a, b in zip(alone_30, batched, strict=True):
        diff = np.abs(np.frombuffer(a.audio, "<i2").astype(int) - np.frombuffer(b.audio, "<i2").astype(int))
        assert diff.max() <= 1
    assert max(model.batcher.batch_sizes - steps_before) == 2  # the two sessions' frames did share steps
