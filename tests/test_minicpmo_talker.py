"""MiniCPM-o's talker on the tiny checkpoint: condition rows from the LLM's tokens and hidden
states, 25 codes per full unit, keys and positions carried within a turn (equal to one
uncached pass over the turn), the end code only where a unit may end the turn."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from vllm_omni.models.minicpmo.talker import Talker, TalkerSampling, TalkerTurn

UNIT_TOKENS = [151706, *range(1000, 1019)]  # the decision (<|speak|>), then 19 text tokens
GREEDY = TalkerSampling(temperature=0.0, repetition_penalty=1.0)


@pytest.fixture(scope="module")
def talker(minicpmo_checkpoint: Path) -> Talker:
    return Talker.from_checkpoint(minicpmo_checkpoint, GREEDY)


def llm_states(seed: int, tokens: int = len(UNIT_TOKENS)) -> torch.Tensor:
    return torch.randn(tokens, 128, generator=torch.Generator().manual_seed(seed))


def test_condition_rows_are_text_plus_normalised_hidden_then_audio_bos(talker: Talker) -> None:
    hidden = llm_states(0)
    rows = talker.condition_rows(UNIT_TOKENS, hidden)
    tts = talker.tts
    assert rows.shape == (len(UNIT_TOKENS), 64)  # the decision token's row is left out, audio_bos added
    expected = tts.emb_text(torch.tensor([UNIT_TOKENS[5]])) + torch.nn.functional.normalize(
        tts.projector_semantic(hidden[5:6]), dim=-1)
    torch.testing.assert_close(rows[4:5], expected)
    torch.testing.assert_close(rows[-1], tts.emb_text(torch.tensor(talker.config.audio_bos_token_id)))
    assert talker.condition_rows(UNIT_TOKENS[:1], hidden[:1]).shape == (1, 64)  # no text: audio_bos alone


def test_a_full_unit_gives_25_codes_and_the_turn_carries_on(talker: Talker) -> None:
    turn = TalkerTurn()
    first = talker.speak_unit(turn, UNIT_TOKENS, llm_states(0), ends_turn=False)
    second = talker.speak_unit(turn, UNIT_TOKENS, llm_states(1), ends_turn=False)
    assert len(first) == len(second) == 25 and all(0 <= c < talker.end_code for c in first + second)
    assert turn.position == turn.cache.get_seq_length() == 2 * (20 + 25)  # rows and fed codes, both units
    assert turn.codes == first + second


@torch.no_grad()
def test_a_turn_spoken_unit_by_unit_equals_one_uncached_pass(talker: Talker) -> None:
    turn, units = TalkerTurn(), []
    for seed in range(3):
        states = llm_states(seed)
        units.append((states, talker.speak_unit(turn, UNIT_TOKENS, states, ends_turn=False)))
    rows, code_positions = [], []
    for states, codes in units:
        rows.append(talker.condition_rows(UNIT_TOKENS, states))
        start = sum(r.shape[0] for r in rows) - 1
        code_positions += range(start, start + len(codes))
        rows.append(talker.tts.emb_code[0](torch.tensor(codes)))
    sequence = torch.cat(rows)
    hidden = talker.tts.model(inputs_embeds=sequence[None], position_ids=torch.arange(sequence.shape[0])[None])
    logits = talker.tts.head_code[0](hidden.last_hidden_state[0, code_positions])
    logits[1:, talker.end_code] = float("-inf")  # only the turn's first step may pick the end code
    assert logits.argmax(-1).tolist() == [code for _, codes in units for code in codes]


def test_the_codes_follow_the_llm(talker: Talker) -> None:
    one = talker.speak_unit(TalkerTurn(), UNIT_TOKENS, llm_states(0), ends_turn=False)
    other = talker.speak_unit(TalkerTurn(), UNIT_TOKENS, llm_states(7), ends_turn=False)
    assert one != other


class FavourCode(torch.nn.Module):
    def __init__(self, head: torch.nn.Module, code: int):
        super().__init__()
        self.head, self.code = head, code

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        logits[..., self.code] += 1e4
        return logits


def test_the_end_code_ends_only_a_turns_first_or_last_unit(talker: Talker) -> None:
    eager = copy.deepcopy(talker)
    eager.tts.head_code[0] = FavourCode(eager.tts.head_code[0], eager.end_code)  # a talker that always wants to stop
    turn = TalkerTurn()
    turn.units = 1  # a middle unit: the end code is never sampled
    assert len(eager.speak_unit(turn, UNIT_TOKENS, llm_states(0), ends_turn=False)) == 25
    assert eager.speak_unit(TalkerTurn(), UNIT_TOKENS, llm_states(0), ends_turn=False) == []  # a first unit
    assert eager.speak_unit(turn, UNIT_TOKENS, llm_states(0), ends_turn=True) == []  # the turn's last unit
