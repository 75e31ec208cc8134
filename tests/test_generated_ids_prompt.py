"""An earlier answer enters the thinker's prompt as the ids the model generated for it, so the
previous turn's prompt and answer stay a prefix of the next prompt (vLLM's prefix cache then
reuses the answer's KV); where those ids do not spell the answer's text, the text is
tokenized as before (prompt.template_ids)."""

from __future__ import annotations

import random

import pytest

from vllm_omni.engine.family import GENERATED_IDS
from vllm_omni.models.qwen3_omni.prompt import template_ids
from vllm_omni.models.qwen3_omni.tiny.config import THINKER_VOCAB
from vllm_omni.models.qwen3_omni.tiny.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(THINKER_VOCAB)


@pytest.fixture(scope="module")
def end_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


def user(text: str) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def answer(text: str, ids: list[int] | None) -> dict:
    message = {"role": "assistant", "content": [{"type": "text", "text": text}]}
    return message if ids is None else {**message, GENERATED_IDS: ids}


def sampled_answer(tokenizer, seed: int) -> tuple[str, list[int]]:
    """Ids as a model samples them: text tokens that, tokenized again, become other tokens."""
    ids = random.Random(seed).sample(range(300, 4000), 30)
    text = tokenizer.decode(ids)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] != ids  # the case that matters
    return text, ids


def ids_of(tokenizer, end_id, messages: list[dict]) -> list[int]:
    return template_ids(tokenizer, messages, (), False, end_id)


def test_each_prompt_is_the_last_one_plus_its_answer_as_generated(tokenizer, end_id) -> None:
    messages = [{"role": "system", "content": "Be brief."}, user("hello there")]
    previous = ids_of(tokenizer, end_id, messages)
    for turn in range(3):
        text, generated = sampled_answer(tokenizer, turn)
        messages += [answer(text, generated + [end_id]), user(f"and then {turn}?")]
        prompt = ids_of(tokenizer, end_id, messages)
        assert prompt[:len(previous)] == previous
        assert prompt[len(previous):len(previous) + len(generated) + 1] == generated + [end_id]
        # the same text as the template renders it
        plain = [{k: v for k, v in m.items() if k != GENERATED_IDS} for m in messages]
        assert tokenizer.decode(prompt) == tokenizer.decode(ids_of(tokenizer, end_id, plain))
        previous = prompt


@pytest.mark.parametrize("case", ["other text", "special token", "slot marks in a message", "tool call"])
def test_ids_that_do_not_spell_the_answer_give_the_text_tokenized(tokenizer, end_id, case) -> None:
    text, generated = sampled_answer(tokenizer, 7)
    question = "what now?"
    if case == "other text":  # a truncated answer: its kept text is shorter than what was generated
        text = text[: len(text) // 2]
    elif case == "special token":  # audio placeholders must never enter a prompt as answer ids
        generated = generated + [tokenizer.convert_tokens_to_ids("<|audio_pad|>")]
    elif case == "slot marks in a message":
        question = "\ue0000\ue001"
    reply = answer(text, generated)
    if case == "tool call":
        reply["tool_calls"] = [{"type": "function", "id": "call_1",
                                "function": {"name": "f", "arguments": "{}"}}]
    with_ids = ids_of(tokenizer, end_id, [user("hi"), reply, user(question)])
    without = ids_of(tokenizer, end_id, [user("hi"), {k: v for k, v in reply.items() if k != GENERATED_IDS},
                                         user(question)])
    assert with_ids == without
