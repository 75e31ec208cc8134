"""MiniCPM-o's per-unit token choices on made-up logits: listen and speak, the 20-position and
28-character caps, the raw chunk_eos draw, masks and penalties, no listening mid-turn, forced
listens (closing an open turn first), and the test-only decision script."""

from __future__ import annotations

import pytest
import torch

from vllm_omni.models.minicpmo.tiny.tokenizer import BAD_TOKEN_IDS, build_tokenizer
from vllm_omni.models.minicpmo.unit_decoder import DuplexTokenIds, UnitDecoder, UnitSampling

VOCAB = 151748
GREEDY = UnitSampling(temperature=0.0)
TEXT = [1000 + i for i in range(40)]  # filler tokens: each decodes to " t<id>" (6 characters)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(VOCAB)


@pytest.fixture(scope="module")
def ids(tokenizer) -> DuplexTokenIds:
    return DuplexTokenIds.from_tokenizer(tokenizer)


def decoder(tokenizer, ids: DuplexTokenIds, sampling: UnitSampling = GREEDY) -> UnitDecoder:
    return UnitDecoder(ids, BAD_TOKEN_IDS, lambda tokens: tokenizer.decode(tokens, skip_special_tokens=True),
                       sampling, torch.Generator().manual_seed(0))


def peaked(*ranked: int) -> torch.Tensor:
    """Logits preferring `ranked` in that order over everything else."""
    logits = torch.zeros(VOCAB)
    for rank, token in enumerate(ranked):
        logits[token] = 20.0 - rank
    return logits


def run_unit(unit_decoder: UnitDecoder, logits_at, **begin) -> list[int]:
    unit_decoder.begin_unit(**begin)
    tokens = []
    for position in range(25):
        choice = unit_decoder.choose(logits_at(position))
        tokens.append(choice.token)
        if choice.ends_unit:
            return tokens
    raise AssertionError(f"the unit never ended: {tokens}")


def test_the_token_ids_are_the_real_tokenizers(ids: DuplexTokenIds) -> None:
    assert (ids.unit, ids.unit_end, ids.listen, ids.speak, ids.chunk_eos, ids.turn_eos, ids.tts_bos) == \
        (151683, 151684, 151705, 151706, 151718, 151717, 151703)


def test_a_listen_unit_is_one_token_and_a_speaking_unit_ends_at_20_positions(tokenizer, ids) -> None:
    unit_decoder = decoder(tokenizer, ids, UnitSampling(temperature=0.0, max_text_chars=10_000))
    assert run_unit(unit_decoder, lambda j: peaked(ids.listen)) == [ids.listen]
    spoken = run_unit(unit_decoder, lambda j: peaked(ids.speak) if j == 0 else peaked(TEXT[j]))
    assert spoken == [ids.speak, *TEXT[1:19], ids.chunk_eos] and not unit_decoder.turn_ended


def test_the_text_cap_ends_a_unit_before_28_characters(tokenizer, ids) -> None:
    unit_decoder = decoder(tokenizer, ids)
    spoken = run_unit(unit_decoder, lambda j: peaked(TEXT[j]))
    assert spoken == [*TEXT[:4], ids.chunk_eos]  # 4 x " t10xx" = 24 characters; a fifth would make 30
    assert len(tokenizer.decode(spoken, skip_special_tokens=True)) < 28


def test_no_listening_while_the_turn_is_open_until_turn_eos(tokenizer, ids) -> None:
    unit_decoder = decoder(tokenizer, ids)
    run_unit(unit_decoder, lambda j: peaked(TEXT[j]))  # the model speaks: its turn is open
    assert run_unit(unit_decoder, lambda j: peaked(ids.listen, TEXT[j]))[0] == ids.tts_bos
    ended = run_unit(unit_decoder, lambda j: peaked(ids.turn_eos) if j == 0 else peaked(ids.listen))
    assert ended == [ids.turn_eos, ids.listen] and unit_decoder.turn_ended


def test_masks_and_the_raw_chunk_eos_draw(tokenizer, ids) -> None:
    unit_decoder = decoder(tokenizer, ids)
    assert run_unit(unit_decoder, lambda j: peaked(ids.chunk_eos, ids.listen)) == [ids.chunk_eos]  # raw draw kept
    unit_decoder.begin_unit()
    assert unit_decoder.choose(peaked(ids.tts_pad, BAD_TOKEN_IDS[0], TEXT[0])).token == TEXT[0]


def test_repetition_and_turn_eos_penalties(tokenizer, ids) -> None:
    unit_decoder = decoder(tokenizer, ids)
    unit_decoder.begin_unit()
    unit_decoder.choose(peaked(TEXT[0]))
    close = torch.zeros(VOCAB)
    close[TEXT[0]], close[TEXT[1]] = 10.0, 9.9  # the repeated token falls below its rival (10 / 1.05)
    assert unit_decoder.choose(close).token == TEXT[1]
    close = torch.zeros(VOCAB)
    close[ids.turn_eos], close[TEXT[2]] = 10.0, 9.5  # turn_eos divided by 1.1
    assert unit_decoder.choose(close).token == TEXT[2]


def test_a_forced_listen_closes_an_open_turn_first(tokenizer, ids) -> None:
    unit_decoder = decoder(tokenizer, ids)
    assert run_unit(unit_decoder, lambda j: peaked(TEXT[j]), forced_listen=True) == [ids.listen]
    run_unit(unit_decoder, lambda j: peaked(TEXT[j]))
    assert run_unit(unit_decoder, lambda j: peaked(TEXT[j]), forced_listen=True) == [ids.turn_eos, ids.listen]


def test_the_decision_script_masks_the_logits(tokenizer, ids) -> None:
    unit_decoder = decoder(tokenizer, ids, UnitSampling(temperature=0.0, max_text_chars=10_000))
    assert run_unit(unit_decoder, lambda j: peaked(TEXT[j]), script="listen") == [ids.listen]
    speaking = run_unit(unit_decoder, lambda j: peaked(ids.listen, ids.chunk_eos, ids.turn_eos, TEXT[j]),
                        script="speak")
    assert speaking == [*TEXT[:19], ids.chunk_eos]
    ending = run_unit(unit_decoder, lambda j: peaked(TEXT[j]), script="speak_end")
    assert ending == [*TEXT[:3], ids.turn_eos, ids.listen] and unit_decoder.turn_ended


def test_sampling_draws_from_the_top_tokens(tokenizer, ids) -> None:
    unit_decoder = decoder(tokenizer, ids, UnitSampling(max_text_chars=10_000))
    logits = torch.full((VOCAB,), -5.0)
    logits[TEXT[:3]] = torch.tensor([3.0, 2.9, 2.8])
    drawn = set()
    for _ in range(30):
        unit_decoder.begin_unit()
        drawn.add(unit_decoder.choose(logits).token)
    assert drawn <= set(TEXT[:3]) and len(drawn) > 1
