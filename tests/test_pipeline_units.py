"""Small pieces of the Qwen3-Omni pipeline: chunking, user segments, sampling."""

from __future__ import annotations

import torch

from vllm_omni.config import CodecChunking, SamplingParams
from vllm_omni.engine.backends.torch_sampling import TokenSampler, apply_repetition_penalty
from vllm_omni.models.qwen3_omni.family import CodecChunker
from vllm_omni.models.qwen3_omni.talker_bridge import user_positions

FRAME = tuple(range(16))


def test_chunker_cuts_initial_then_regular_chunks() -> None:
    chunking = CodecChunking(initial_codec_chunk_frames=2, codec_chunk_frames=3, ramp_codec_chunks=False)
    chunker = CodecChunker(chunking, streaming=True)
    sizes = [chunk.shape[1] for chunk in (chunker.add(FRAME) for _ in range(9)) if chunk is not None]
    assert sizes == [2, 3, 3]
    assert chunker.flush().shape == (16, 1)
    assert chunker.flush().shape == (16, 0)


def test_ramped_chunks_grow_by_half_the_audio_sent_up_to_the_regular_size() -> None:
    chunker = CodecChunker(CodecChunking(initial_codec_chunk_frames=1, codec_chunk_frames=25), streaming=True)
    sizes = [chunk.shape[1] for chunk in (chunker.add(FRAME) for _ in range(110)) if chunk is not None]
    assert sizes == [1, 1, 1, 1, 2, 3, 4, 6, 9, 14, 21, 25]
    assert chunker.flush().shape == (16, 110 - sum(sizes))


def test_chunker_without_streaming_holds_everything() -> None:
    chunker = CodecChunker(CodecChunking(), streaming=False)
    assert all(chunker.add(FRAME) is None for _ in range(60))
    assert chunker.flush().shape == (16, 60)


def test_user_positions_cover_user_blocks_only() -> None:
    im_start, user, system, assistant = 1, 10, 11, 12
    ids = torch.tensor([im_start, system, 5, 2, im_start, user, 6, 7, 2, im_start, assistant, 8, 2,
                        im_start, user, 9, 2, im_start, assistant])
    assert user_positions(ids, im_start, user).tolist() == [4, 5, 6, 7, 8, 13, 14, 15, 16]


def test_repetition_penalty_follows_transformers() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0])
    penalised = apply_repetition_penalty(logits, [0, 1], 2.0)
    assert penalised.tolist() == [1.0, -4.0, 1.0]
    assert apply_repetition_penalty(logits, [0], 1.0) is logits


def test_greedy_and_seeded_sampling() -> None:
    logits = torch.tensor([0.1, 3.0, 0.2, 2.9])
    assert TokenSampler(SamplingParams(temperature=0.0)).choose(logits) == 1
    draws = [TokenSampler(SamplingParams(temperature=1.0, top_k=2, seed=7)).choose(logits) for _ in range(3)]
    assert len(set(draws)) == 1 and draws[0] in (1, 3)  # same seed, same draw; only the top 2
    sampler = TokenSampler(SamplingParams(temperature=1.0, top_p=0.4, seed=1))
    assert all(sampler.choose(logits) == 1 for _ in range(20))  # nucleus of one token


def test_incremental_detokenizer_matches_one_shot_decoding(tiny_checkpoint) -> None:
    from transformers import AutoTokenizer

    from vllm_omni.engine.detokenizer import IncrementalDetokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    text = "Héllo wörld, 日本語 and émojis 🙂 — fine."
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    detokenizer = IncrementalDetokenizer(tokenizer)
    results = [detokenizer.add(token) for token in ids]
    deltas = [delta for delta, _ in results]
    assert "".join(deltas) == detokenizer.text == text
    covered = [token for _, token_ids in results for token in token_ids]
    assert covered == ids[: len(covered)] and len(covered) >= len(ids) - 1  # every text token, once, in order
    assert all("\ufffd" not in delta for delta in deltas)
    assert sum(1 for d in deltas if d) > 10  # streamed, not all at the end
