"""Qwen2.5-Omni's staged pipeline equals transformers' `generate(return_audio=True)` on the tiny
checkpoint: thinker token ids and talker codes identical, PCM within one LSB (the DiT's noise
drawn from the same seed), with async_chunk off (token2wav solves the whole answer at once).
Streamed (async_chunk on), the tokens and codes are the same for every chunk setting and the
audio stays within the bound tests/test_qwen2_5_omni_token2wav.py measures.

The reference restores what transformers 5.19's `generate` loses for an unpadded prompt: it
drops the all-ones attention mask before the talker's first forward, and with it the codec
pad/bos embeddings the talker adds to its prompt (docs/qwen2_5_omni.md, "Reference").
"""

from __future__ import annotations

import asyncio
import functools
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoProcessor, Qwen2_5OmniForConditionalGeneration

from tests.conftest import read_fixture_pcm
from tests.engine_helpers import async_chunk_set_to, run_request
from tests.hf_reference import hf_messages
from tests.qwen2_5_omni_helpers import make_engine
from vllm_omni.audio.pcm import float_to_pcm16
from vllm_omni.engine import Message, OmniRequest

THINKER_TOKENS, TALKER_TOKENS = 16, 90
SEED = 0  # the DiT noise seed configs/qwen2_5_omni_tiny_cpu_torch.yaml fixes for the code2wav stage
SPEAKER = "Chelsie"
CASES = {
    "text": [("user", "Tell me a story about the sea.", None)],
    "audio": [("system", "You are a helpful voice assistant.", None), ("user", None, "speech_en_single.wav")],
}
SETTINGS = {"sync": (False, 12, 48), "async-12-48": (True, 12, 48), "async-24-24": (True, 24, 24)}


@contextmanager
def talker_prefill_with_mask(model: Qwen2_5OmniForConditionalGeneration):
    """Gives the talker's first forward the all-ones mask `generate` dropped (module docstring)."""
    forward = model.talker.forward

    @functools.wraps(forward)  # generate checks its kwargs against forward's signature
    def with_mask(*args: Any, attention_mask=None, past_key_values=None, inputs_embeds=None, **kwargs: Any):
        first = past_key_values is None or past_key_values.get_seq_length() == 0
        if attention_mask is None and inputs_embeds is not None and first:
            attention_mask = torch.ones(inputs_embeds.shape[:2], dtype=torch.long)
        return forward(*args, attention_mask=attention_mask, past_key_values=past_key_values,
                       inputs_embeds=inputs_embeds, **kwargs)

    model.talker.forward = with_mask
    try:
        yield
    finally:
        del model.talker.forward


@pytest.fixture(scope="module")
def reference(qwen2_5_omni_checkpoint):
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(qwen2_5_omni_checkpoint, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(qwen2_5_omni_checkpoint)
    im_end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    results: dict[str, dict] = {}

    def run(case: str) -> dict:
        if case in results:
            return results[case]
        messages, audios = hf_messages([(role, text, 0, audio) for role, text, audio in CASES[case]])
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=prompt, audio=audios or None, return_tensors="pt")
        codes: dict[str, torch.Tensor] = {}
        token2wav = model.token2wav.forward

        def keep_codes(code, **kwargs):
            codes["codes"] = code[0].clone()
            return token2wav(code, **kwargs)

        model.token2wav.forward = keep_codes
        try:
            with talker_prefill_with_mask(model):
                torch.manual_seed(SEED)
                sequences, waveform = model.generate(
                    **inputs, speaker=SPEAKER, thinker_do_sample=False, thinker_max_new_tokens=THINKER_TOKENS,
                    thinker_eos_token_id=im_end, talker_do_sample=False, talker_max_new_tokens=TALKER_TOKENS)
        finally:
            del model.token2wav.forward
        results[case] = {"tokens": sequences[0, inputs["input_ids"].shape[1]:].tolist(),
                         "codes": codes["codes"].numpy(),
                         "pcm": float_to_pcm16(waveform.reshape(-1).numpy()).astype(np.int32)}
        return results[case]

    return run


@pytest.fixture(scope="module")
def engines(qwen2_5_omni_checkpoint):
    built = {name: make_engine(qwen2_5_omni_checkpoint, *setting) for name, setting in SETTINGS.items()}
    yield built
    for engine in built.values():
        engine.shutdown()


def engine_request(case: str) -> OmniRequest:
    messages = [Message(role, text=text, audio=read_fixture_pcm(audio) if audio else None)
                for role, text, audio in CASES[case]]
    return OmniRequest(messages, speaker=SPEAKER,
                       sampling={"thinker": {"max_tokens": THINKER_TOKENS}, "talker": {"max_tokens": TALKER_TOKENS}})


@pytest.mark.parametrize("case", list(CASES))
def test_whole_answer_equals_transformers_generate(case: str, reference, engines) -> None:
    expected = reference(case)
    ours = asyncio.run(run_request(engines["sync"], engine_request(case)))
    final = ours["final"]
    assert final.finish_reason in ("stop", "length") and final.error is None, final
    assert list(final.token_ids) == expected["tokens"]
    assert np.array_equal(ours["codes"], expected["codes"])
    assert len(expected["codes"]) > 24  # more than two DiT blocks: the windows matter
    assert ours["pcm"].shape == expected["pcm"].shape
    assert np.abs(ours["pcm"] - expected["pcm"]).max() <= 1
    assert np.abs(ours["pcm"]).max() > 100  # real signal, not silence


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s != "sync"])
def test_streaming_keeps_the_tokens_and_codes(setting: str, reference, engines) -> None:
    expected = reference("audio")
    ours = asyncio.run(run_request(engines[setting], engine_request("audio")))
    assert ours["final"].error is None, ours["final"]
    assert list(ours["final"].token_ids) == expected["tokens"]
    assert np.array_equal(ours["codes"], expected["codes"])
    assert ours["pcm"].shape == expected["pcm"].shape
    assert len(ours["chunks"]) > 1  # streamed in pieces


@pytest.mark.parametrize("case", list(CASES))
def test_whole_answer_with_the_thinker_on_vllm_equals_transformers_generate(case: str, reference,
                                                                           qwen2_5_omni_vllm_engine) -> None:
    """configs/qwen2_5_omni_tiny_cpu.yaml: the thinker's rows come from vLLM's worker (the
    prompt's, then each fed answer token's), and the whole answer is transformers' exactly."""
    expected = reference(case)
    with async_chunk_set_to(qwen2_5_omni_vllm_engine, False):
        ours = asyncio.run(run_request(qwen2_5_omni_vllm_engine, engine_request(case)))
    assert ours["final"].error is None, ours["final"]
    assert list(ours["final"].token_ids) == expected["tokens"]
    assert np.array_equal(ours["codes"], expected["codes"])
    assert ours["pcm"].shape == expected["pcm"].shape
    assert np.abs(ours["pcm"] - expected["pcm"]).max() <= 1


def test_streamed_with_the_thinker_on_vllm_keeps_the_tokens_and_codes(reference, qwen2_5_omni_vllm_engine) -> None:
    expected = reference("audio")
    with async_chunk_set_to(qwen2_5_omni_vllm_engine, True):
        ours = asyncio.run(run_request(qwen2_5_omni_vllm_engine, engine_request("audio")))
    assert ours["final"].error is None, ours["final"]
    assert list(ours["final"].token_ids) == expected["tokens"]
    assert np.array_equal(ours["codes"], expected["codes"])
    assert len(ours["chunks"]) > 1
