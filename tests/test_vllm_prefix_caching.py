"""Prefix caching on the vLLM engines across the turns of one spoken conversation: later
turns prefill only what earlier turns did not (thinker and talker), earlier answers included
(they are in the prompt as the ids the thinker generated, so the KV of their decode is
reused), the thinker rows of the cached positions come from its worker's store (no request
runs twice), and every turn's tokens, codec ids and audio equal transformers' on the whole
conversation. Runs on the session's shared vLLM engines (`vllm_engine`)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import numpy as np
import torch

from tests.conftest import read_fixture_pcm
from tests.engine_helpers import run_request
from tests.hf_reference import cached_reference, hf_generate, hf_messages
from tests.test_pipeline_parity import TALKER_TOKENS, THINKER_TOKENS
from vllm_omni.audio.pcm import float_to_pcm16
from vllm_omni.engine import Message, OmniRequest

SYSTEM = "You are a helpful voice assistant."
USER_TURNS = [(None, "speech_en_single.wav"), ("And tomorrow?", "speech_with_pause.wav"),
              (None, "speech_en_single.wav")]  # (text, audio fixture)


def reference_run(model, processor, case: tuple) -> dict:
    """transformers on the conversation's prompt as the processor renders it, with the ids of
    `case`'s prompt (ours: it holds the earlier answers as generated, which must spell the
    same text)."""
    conversation, prompt_ids = case
    messages, audios = hf_messages([(role, text, 0, audio) for role, text, audio, _ in conversation])
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=prompt, audio=audios or None, return_tensors="pt")
    decode = processor.tokenizer.decode
    assert decode(list(prompt_ids)) == decode(inputs["input_ids"][0].tolist())
    inputs["input_ids"] = torch.tensor([prompt_ids])
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    sequences, _, codes = hf_generate(model, inputs, speaks=True, thinker_tokens=THINKER_TOKENS,
                                      talker_tokens=TALKER_TOKENS)
    with torch.no_grad():
        pcm = float_to_pcm16(model.code2wav(codes[None]).reshape(-1).numpy()).astype(np.int32)
    return {"tokens": sequences[0, inputs["input_ids"].shape[1]:].tolist(), "codes": codes.numpy(), "pcm": pcm}


class Requests:
    """Every request one stage's driver sends its vLLM engine: the prompt, and the prompt
    tokens vLLM served from its prefix cache (`num_cached_tokens` of the first output)."""

    def __init__(self, engine, monkeypatch):
        self.block_size = engine.vllm_config.cache_config.block_size
        self.calls: list[dict] = []
        real_generate = engine.generate

        async def recording(prompt, sampling, request_id, *args, **kwargs):
            call = {"request_id": request_id, "prompt": prompt, "cached": None}
            self.calls.append(call)
            async with aclosing(real_generate(prompt, sampling, request_id, *args, **kwargs)) as outputs:
                async for output in outputs:
                    if call["cached"] is None:
                        call["cached"] = output.num_cached_tokens
                    yield output

        monkeypatch.setattr(engine, "generate", recording)

    def of(self, request_id: str) -> list[dict]:
        return [call for call in self.calls if call["request_id"] == request_id]


def test_later_turns_prefill_only_what_is_new_and_equal_transformers(tiny_checkpoint, vllm_engine,
                                                                     monkeypatch) -> None:
    thinker, talker = (Requests(vllm_engine.workers[role].replicas[0].driver.engine, monkeypatch)
                       for role in ("thinker", "talker"))
    reference = cached_reference(tiny_checkpoint, reference_run)
    # (role, text, audio fixture, generated ids)
    conversation: list[tuple[str, str | None, str | None, tuple[int, ...]]] = [("system", SYSTEM, None, ())]
    turns = []
    for text, audio in USER_TURNS:
        conversation.append(("user", text, audio, ()))
        messages = [Message(role, text=t, audio=read_fixture_pcm(a) if a else None, token_ids=ids)
                    for role, t, a, ids in conversation]
        request = OmniRequest(messages, speaker="Ethan", sampling={"thinker": {"max_tokens": THINKER_TOKENS},
                                                                   "talker": {"max_tokens": TALKER_TOKENS}})
        ours = asyncio.run(run_request(vllm_engine, request))
        prompt_ids = vllm_engine.family.last_prompt.input_ids
        if turns:  # the previous prompt and answer, as they were: a prefix of this prompt
            previous = turns[-1]["ids"]
            assert prompt_ids[:len(previous)] == previous
            assert prompt_ids[len(previous):len(previous) + len(conversation[-2][3])] == list(conversation[-2][3])
        expected = reference((tuple(conversation), tuple(prompt_ids)))
        assert ours["final"].error is None
        assert list(ours["final"].token_ids) == expected["tokens"]
        assert np.array_equal(ours["codes"], expected["codes"])
        assert ours["pcm"].shape == expected["pcm"].shape and np.abs(ours["pcm"] - expected["pcm"]).max() <= 1
        (thinker_call,), (talker_call,) = thinker.of(request.request_id), talker.of(request.request_id)
        assert "cache_salt" not in thinker_call["prompt"]  # run once: the store had every row the talker reads
        assert ours["final"].usage.cached_tokens == thinker_call["cached"]  # reported as usage's cached_tokens
        answer = ours["final"].token_ids
        # vLLM computed KV for the prompt and every generated token but the last
        turns.append({"ids": prompt_ids, "thinker": (len(prompt_ids), thinker_call["cached"], len(answer) - 1),
                      "talker": (len(talker_call["prompt"]["prompt_embeds"]), talker_call["cached"], 0)})
        conversation.append(("assistant", ours["text"], None, answer))
    print("(prompt tokens, from the prefix cache, answer tokens with KV) per turn:",
          [{stage: turn[stage] for stage in ("thinker", "talker")} for turn in turns])
    for stage, requests in (("thinker", thinker), ("talker", talker)):
        for before, turn in zip(turns, turns[1:], strict=False):  # what had KV before, to its last full block
            computed = before[stage][0] + before[stage][2]
            assert turn[stage][1] >= computed // requests.block_size * requests.block_size, turns
        assert turns[-1][stage][1] > 0, turns
