"""Prefix caching on Qwen2.5-Omni's vLLM thinker across the turns of one spoken conversation:
its talker reads the thinker rows of the whole prompt, earlier answers included, so the
worker keeps each finished request's prompt and fed answer (qwen3_omni/vllm_backend/capture.py)
and later turns find the rows of everything vLLM serves from its cache there; no prompt is
prefilled twice, and every turn's tokens, codes and audio equal the torch backend's (itself
transformers' exactly: tests/test_qwen2_5_omni_parity.py) on the same conversation."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.conftest import read_fixture_pcm
from tests.engine_helpers import async_chunk_set_to, run_request
from tests.qwen2_5_omni_helpers import make_engine
from tests.test_vllm_prefix_caching import Requests
from vllm_omni.engine import Message, OmniRequest

SYSTEM = "You are a helpful voice assistant."
USER_TURNS = [(None, "speech_en_single.wav"), ("And tomorrow?", "speech_with_pause.wav"),
              (None, "speech_en_single.wav")]  # (text, audio fixture)
THINKER_TOKENS, TALKER_TOKENS = 12, 60


@pytest.fixture(scope="module")
def torch_engine(qwen2_5_omni_checkpoint):
    engine = make_engine(qwen2_5_omni_checkpoint, async_chunk=False)
    yield engine
    engine.shutdown()


def test_later_turns_prefill_only_what_is_new_and_equal_the_torch_backend(qwen2_5_omni_vllm_engine, torch_engine,
                                                                          monkeypatch) -> None:
    engine = qwen2_5_omni_vllm_engine
    thinker = Requests(engine.workers["thinker"].replicas[0].driver.engine, monkeypatch)
    conversation: list[tuple[str, str | None, str | None, tuple[int, ...]]] = [("system", SYSTEM, None, ())]
    turns = []
    for text, audio in USER_TURNS:
        conversation.append(("user", text, audio, ()))
        results = []
        for serving in (engine, torch_engine):
            messages = [Message(role, text=t, audio=read_fixture_pcm(a) if a else None, token_ids=ids)
                        for role, t, a, ids in conversation]
            request = OmniRequest(messages, speaker="Ethan", sampling={"thinker": {"max_tokens": THINKER_TOKENS},
                                                                       "talker": {"max_tokens": TALKER_TOKENS}})
            with async_chunk_set_to(serving, False):
                results.append((request, asyncio.run(run_request(serving, request))))
        (request, ours), (_, expected) = results
        assert ours["final"].error is None, ours["final"]
        assert list(ours["final"].token_ids) == list(expected["final"].token_ids)
        assert np.array_equal(ours["codes"], expected["codes"]) and len(ours["codes"]) > 0
        assert ours["pcm"].shape == expected["pcm"].shape and np.abs(ours["pcm"] - expected["pcm"]).max() <= 1
        (call,) = thinker.of(request.request_id)  # no uncached prefill for missing rows beside it
        answer = ours["final"].token_ids
        turns.append((len(engine.family.last_prompt.input_ids), call["cached"], len(answer) - 1))
        conversation.append(("assistant", ours["text"], None, answer))
    print("(prompt tokens, from the prefix cache, answer tokens with KV) per turn:", turns)
    for before, turn in zip(turns, turns[1:], strict=False):  # what had KV before, to its last full block
        assert turn[1] >= (before[0] + before[2]) // thinker.block_size * thinker.block_size, turns
    assert turns[-1][1] > turns[0][0], turns  # the cache covered a whole earlier answer
