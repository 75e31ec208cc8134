"""A long conversation fitted to the context and the media limits: what goes, and that
consecutive turns leave out the same oldest turns (so their prompts share a prefix that
vLLM's prefix cache reuses) instead of sliding by one turn every time."""

from __future__ import annotations

import pytest

from vllm_omni.engine.prompting import Turn, fit_context, fit_media_limit
from vllm_omni.engine.request import RequestError


class WordFamily:
    """A stand-in family: a message's tokens are its words (the real render is tested with
    the engines; here only the lengths matter)."""

    def __init__(self, max_model_len: int):
        self.max_model_len = max_model_len

    def render(self, messages, audio_features, tools=(), call_tool=False, images=()):
        return [word for message in messages for part in message["content"] for word in part["text"].split()]


def conversation(turns: int, words: int = 100) -> list[Turn]:
    system = [Turn({"role": "system", "content": [{"type": "text", "text": "be brief"}]})]
    said = [Turn({"role": "user" if i % 2 == 0 else "assistant",
                  "content": [{"type": "text", "text": f"t{i} " + "w " * (words - 1)}]}) for i in range(turns)]
    return system + said


def first_kept_turn(prompt: list[str]) -> str:
    return next(word for word in prompt if word.startswith("t"))


def test_a_conversation_that_fits_is_untouched() -> None:
    prompt = fit_context(WordFamily(1000), conversation(9))
    assert len(prompt) == 2 + 900 and first_kept_turn(prompt) == "t0"


def test_the_oldest_turns_go_a_quarter_of_the_context_at_a_time() -> None:
    family = WordFamily(1000)  # a quarter: 250 tokens, i.e. 5 turns of 50 words
    prompts = [fit_context(family, conversation(turns, words=50)) for turns in range(21, 33, 2)]
    # 21 turns (1052 tokens) need 53 gone and 250 go; 23 turns still fit without the same 5
    # (the same prefix); 25 turns need 253 gone, so 500 go; and so on.
    assert [first_kept_turn(p) for p in prompts] == ["t5", "t5", "t10", "t10", "t10", "t15"]
    assert [len(p) for p in prompts] == [802, 902, 752, 852, 952, 802]


def test_the_system_turn_and_the_current_turn_always_stay() -> None:
    family = WordFamily(250)
    prompt = fit_context(family, conversation(5))
    assert prompt[:2] == ["be", "brief"] and first_kept_turn(prompt) == "t4" and len(prompt) == 102
    with pytest.raises(RequestError, match="the model's context is 250"):
        fit_context(family, conversation(1, words=300))


def media_turns(items: int) -> list[Turn]:
    return [Turn({"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": f"t{i}"}]},
                 {"audio": [f"clip{i}"], "image": []}) for i in range(items)]


def kept_clips(turns: list[Turn]) -> list[str]:
    return [clip for turn in turns for clip in turn.media["audio"]]


def test_audio_items_go_a_quarter_of_the_limit_at_a_time() -> None:
    kept = []
    for items in (16, 17, 18, 20, 21):
        turns = media_turns(items)
        fit_media_limit(turns, "audio", 16, "thinker")
        kept.append(kept_clips(turns))
        assert all(turn.message["content"][-1]["type"] == "text" for turn in turns)  # texts stay
    assert [len(k) for k in kept] == [16, 13, 14, 16, 13]
    assert [k[0] for k in kept] == ["clip0", "clip4", "clip4", "clip4", "clip8"]


def test_current_turn_over_the_media_limit_is_refused() -> None:
    turns = [Turn({"role": "user", "content": [{"type": "audio"}, {"type": "audio"}]},
                  {"audio": ["a", "b"], "image": []})]
    with pytest.raises(RequestError, match="allows 1 audio items"):
        fit_media_limit(turns, "audio", 1, "thinker")
