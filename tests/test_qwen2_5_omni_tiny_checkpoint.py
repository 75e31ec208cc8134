"""The tiny Qwen2.5-Omni checkpoint (`vllm-omni make-tiny-model --arch qwen2_5_omni`): transformers'
architecture with the real vocabularies, ids and speaker file layout, offline loading, deterministic
bytes, a thinker that listens and a token2wav that speaks audibly."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoProcessor,
    Qwen2_5OmniConfig,
    Qwen2_5OmniForConditionalGeneration,
    Qwen2_5OmniProcessor,
)

from vllm_omni.cli.tiny_model_cmd import make_tiny_model
from vllm_omni.models.qwen2_5_omni.tiny.checkpoint import SPEAKERS_FILE, build_tiny_checkpoint
from vllm_omni.models.qwen2_5_omni.tiny.config import SPEAKER_BOS
from vllm_omni.models.tiny_weights import find_weight_problems

SAMPLE_RATE = 16000
AUDIO_PROMPT = "<|im_start|>user\n<|audio_bos|><|AUDIO|><|audio_eos|><|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model(qwen2_5_omni_checkpoint: Path) -> Qwen2_5OmniForConditionalGeneration:
    return Qwen2_5OmniForConditionalGeneration.from_pretrained(
        qwen2_5_omni_checkpoint, local_files_only=True, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def processor(qwen2_5_omni_checkpoint: Path) -> Qwen2_5OmniProcessor:
    return AutoProcessor.from_pretrained(qwen2_5_omni_checkpoint, local_files_only=True)


def _noise_bursts(seconds: float = 2.0) -> np.ndarray:
    """Speech-like input: 150 ms Hann-shaped noise bursts every 250 ms."""
    rng = np.random.default_rng(0)
    audio = np.zeros(int(seconds * SAMPLE_RATE), np.float32)
    burst = int(0.15 * SAMPLE_RATE)
    for start in range(0, len(audio) - burst, int(0.25 * SAMPLE_RATE)):
        audio[start:start + burst] = 0.3 * rng.standard_normal(burst) * np.hanning(burst)
    return audio


def _audio_inputs(processor, audio: np.ndarray):
    messages = [{"role": "user", "content": [{"type": "audio"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == AUDIO_PROMPT
    return processor(text=text, audio=[audio], return_tensors="pt")


def test_config_is_the_real_architecture(qwen2_5_omni_checkpoint: Path) -> None:
    config = AutoConfig.from_pretrained(qwen2_5_omni_checkpoint, local_files_only=True)
    assert isinstance(config, Qwen2_5OmniConfig)
    assert config.architectures == ["Qwen2_5OmniForConditionalGeneration"]
    thinker, talker, dit = config.thinker_config, config.talker_config, config.token2wav_config.dit_config
    text = thinker.text_config
    assert (text.vocab_size, talker.vocab_size, dit.num_embeds, dit.mel_dim) == (152064, 8448, 8193, 80)
    assert (thinker.audio_token_index, thinker.image_token_index, thinker.video_token_index) == (151646, 151655, 151656)
    assert (talker.tts_codec_start_token_id, talker.tts_codec_end_token_id, talker.tts_codec_pad_token_id,
            talker.tts_codec_mask_token_id) == (8293, 8294, 8292, 8296)
    assert text.hidden_size // text.num_attention_heads == 64 and talker.head_dim == 64
    assert sum(text.rope_parameters["mrope_section"]) == 32
    assert talker.embedding_size == text.hidden_size == thinker.audio_config.output_dim
    assert text.tie_word_embeddings is False and talker.tie_word_embeddings is False
    assert int(np.prod(config.token2wav_config.bigvgan_config.upsample_rates)) == 240  # 100 mel frames/s at 24 kHz


def test_loads_offline_with_every_weight_and_both_speakers(qwen2_5_omni_checkpoint: Path, model) -> None:
    saved = load_file(qwen2_5_omni_checkpoint / "model.safetensors")
    state = model.state_dict()
    assert set(state) == set(saved)  # nothing missing, nothing unexpected
    assert all(torch.equal(state[name], value) for name, value in saved.items())
    assert find_weight_problems(model) == []
    assert sorted(model.speaker_map) == ["Chelsie", "Ethan"]
    dit = model.config.token2wav_config.dit_config
    for name, params in model.speaker_map.items():
        assert params["bos_token"] == SPEAKER_BOS[name]
        assert params["cond"].shape == (1, dit.enc_emb_dim) and params["ref_mel"].shape == (1, 400, dit.mel_dim)


def test_tokenizer_and_processor_round_trip(processor) -> None:
    tokenizer = processor.tokenizer
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|AUDIO|>": 151646,
                "<|audio_bos|>": 151647, "<|audio_eos|>": 151648, "<|vision_bos|>": 151652,
                "<|vision_eos|>": 151653, "<|IMAGE|>": 151655, "<|VIDEO|>": 151656, "<|file_sep|>": 151664,
                "user": 872, "assistant": 77091, "\n": 198}
    for text, token_id in expected.items():
        assert tokenizer.encode(text, add_special_tokens=False) == [token_id], text
    assert len(tokenizer) == 152064 and tokenizer.decode([152063]) != ""
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "hi"}]}]
    assert processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<|vision_bos|><|IMAGE|><|vision_eos|>"
        "<|vision_bos|><|VIDEO|><|vision_eos|>hi<|im_end|>\n<|im_start|>assistant\n")
    inputs = _audio_inputs(processor, _noise_bursts())
    frames = int(inputs["feature_attention_mask"].sum())
    assert frames == 100 * 2 and inputs["input_features"].shape[1] == 128
    assert int((inputs["input_ids"] == 151646).sum()) == 50  # 25 audio tokens per second


def test_same_seed_same_bytes(qwen2_5_omni_checkpoint: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert make_tiny_model(argparse.Namespace(arch="qwen2_5_omni", out=str(again), seed=0)) == 0
    names = sorted(path.name for path in qwen2_5_omni_checkpoint.iterdir())
    assert SPEAKERS_FILE in names and "model.safetensors" in names and "generation_config.json" in names
    assert sorted(path.name for path in again.iterdir()) == names
    for name in names:
        assert (again / name).read_bytes() == (qwen2_5_omni_checkpoint / name).read_bytes(), name
    other = build_tiny_checkpoint(tmp_path / "other", seed=1)
    for name in ("model.safetensors", SPEAKERS_FILE):
        assert (other / name).read_bytes() != (qwen2_5_omni_checkpoint / name).read_bytes(), name


def test_generate_returns_text_and_audible_speech(model, processor) -> None:
    inputs = _audio_inputs(processor, _noise_bursts())
    torch.manual_seed(0)  # token2wav's DiT starts from random noise
    sequences, waveform = model.generate(**inputs, speaker="Chelsie", thinker_do_sample=False, talker_do_sample=False,
                                         thinker_max_new_tokens=8, talker_max_new_tokens=40, generation_mode="audio")
    assert sequences.shape[1] > inputs["input_ids"].shape[1]
    samples = waveform.reshape(-1).float().numpy()
    assert len(samples) >= 240 * 2 * 4  # a few codec frames (2 mel frames each, 240 samples per mel frame)
    assert np.isfinite(samples).all()
    assert 0.01 < np.abs(samples).max() < 1.0  # audible, and not clipped by BigVGAN's final clamp


@torch.inference_mode()
def test_thinker_listens(model, processor) -> None:
    logits = {}
    for name, audio in (("bursts", _noise_bursts()), ("silence", np.zeros(2 * SAMPLE_RATE, np.float32))):
        logits[name] = model.thinker(**_audio_inputs(processor, audio)).logits[0, -1]
    difference = (logits["bursts"] - logits["silence"]).abs().mean()
    assert difference > 0.2 * logits["silence"].std()
    assert logits["bursts"].argmax() != logits["silence"].argmax()
