"""The tiny Qwen3-Omni checkpoint: real architecture, offline loading, deterministic, listens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (
    AutoConfig,
    AutoProcessor,
    AutoTokenizer,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
)

from tests.conftest import read_fixture_pcm
from vllm_omni.models.qwen3_omni.tiny.checkpoint import build_tiny_checkpoint
from vllm_omni.models.tiny_weights import find_weight_problems

CODEC_FRAME_RATE_HZ = 12.5  # one talker frame per 80 ms


@pytest.fixture(scope="module")
def model(tiny_checkpoint: Path) -> Qwen3OmniMoeForConditionalGeneration:
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def processor(tiny_checkpoint: Path):
    return AutoProcessor.from_pretrained(tiny_checkpoint)


def test_checkpoint_files_and_offline_loading(tiny_checkpoint: Path) -> None:
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja", "processor_config.json"):
        assert (tiny_checkpoint / name).is_file(), name
    config = AutoConfig.from_pretrained(tiny_checkpoint)
    assert isinstance(config, Qwen3OmniMoeConfig)
    assert config.architectures == ["Qwen3OmniMoeForConditionalGeneration"]
    for sub in (config.thinker_config.text_config, config.talker_config.text_config,
                config.talker_config.code_predictor_config):
        assert sub.head_dim == 64
    processor_config = json.loads((tiny_checkpoint / "processor_config.json").read_text())
    feature_extractor = processor_config["feature_extractor"]
    assert feature_extractor["feature_size"] == 128 and feature_extractor["sampling_rate"] == 16000


def test_tokenizer_knows_every_special_token_the_configs_use(tiny_checkpoint: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    config = AutoConfig.from_pretrained(tiny_checkpoint)
    thinker = config.thinker_config
    expected = {
        "<|im_start|>": config.im_start_token_id, "<|im_end|>": config.im_end_token_id,
        "<tts_pad>": config.tts_pad_token_id, "<tts_text_bos>": config.tts_bos_token_id,
        "<tts_text_eod>": config.tts_eos_token_id,
        "<|audio_start|>": thinker.audio_start_token_id, "<|audio_end|>": thinker.audio_end_token_id,
        "<|audio_pad|>": thinker.audio_token_id, "<|image_pad|>": thinker.image_token_id,
        "<|video_pad|>": thinker.video_token_id, "<|vision_start|>": thinker.vision_start_token_id,
        "<|vision_end|>": thinker.vision_end_token_id,
        "system": config.system_token_id, "user": config.user_token_id,
        "assistant": config.assistant_token_id, "\n": 198,
    }
    for text, token_id in expected.items():
        assert tokenizer.encode(text, add_special_tokens=False) == [token_id], text
    assert len(tokenizer) == thinker.text_config.vocab_size
    assert tokenizer.decode([152063]) != ""  # every id a random model can emit decodes
    assert tokenizer.decode(tokenizer.encode("Hello, world!")) == "Hello, world!"


def test_chat_template_and_processor_build_the_real_layout(tiny_checkpoint: Path, processor) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                    "<|audio_start|><|audio_pad|><|audio_end|>hi<|im_end|>\n<|im_start|>assistant\n")
    audio = read_fixture_pcm("speech_en_single.wav")
    inputs = processor(text=text, audio=[audio], return_tensors="pt")
    frames = len(audio) // 160
    assert inputs["input_features"].shape == (1, 128, frames)
    audio_tokens = int((inputs["input_ids"] == 151675).sum())
    assert audio_tokens == 13 * (frames // 100) + 1 + ((frames % 100) - 1) // 8  # 13 per second


def test_no_weight_is_missing_a_signal(model) -> None:
    assert find_weight_problems(model) == []
    experts = model.talker.model.layers[0].mlp.experts.gate_up_proj
    router = model.talker.model.layers[0].mlp.gate.weight
    assert 0.01 < experts.std().item() < 0.05 and 0.01 < router.std().item() < 0.05


def test_weight_checker_reports_zero_and_nan_weights() -> None:
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    with torch.no_grad():
        layer[0].weight.zero_()
        layer[1].weight[0, 0] = float("nan")
    problems = find_weight_problems(layer)
    assert [p.split(":")[0] for p in problems] == ["0.weight", "1.weight"]


def test_same_seed_same_bytes(tmp_path: Path, tiny_checkpoint: Path) -> None:
    again = build_tiny_checkpoint(tmp_path / "again", seed=0)
    other = build_tiny_checkpoint(tmp_path / "other", seed=1)
    weights = (tiny_checkpoint / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights
    assert (again / "tokenizer.json").read_bytes() == (tiny_checkpoint / "tokenizer.json").read_bytes()


def _generate(model, processor, fixture: str, return_audio: bool):
    messages = [{"role": "user", "content": [{"type": "audio"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=text, audio=[read_fixture_pcm(fixture)], return_tensors="pt")
    with torch.no_grad():
        result = model.generate(**inputs, return_audio=return_audio, speaker="Ethan",
                                thinker_max_new_tokens=16, thinker_do_sample=False,
                                talker_max_new_tokens=24, talker_do_sample=False)
    sequences, waveform = result if return_audio else (result, None)
    return sequences[0, inputs["input_ids"].shape[1]:].tolist(), waveform


def test_generate_returns_24khz_speech_from_audio_input(model, processor) -> None:
    tokens, waveform = _generate(model, processor, "speech_en_single.wav", return_audio=True)
    assert len(tokens) > 0
    samples = waveform.reshape(-1).float().numpy()
    code2wav = model.config.code2wav_config
    samples_per_frame = int(np.prod(code2wav.upsample_rates) * np.prod(code2wav.upsampling_ratios))
    assert samples_per_frame * CODEC_FRAME_RATE_HZ == 24000
    assert len(samples) > samples_per_frame
    assert np.isfinite(samples).all()
    peak = np.abs(samples).max()
    assert 0.01 < peak < 1.0  # audible, and not clipped by code2wav's final clamp
    assert (np.round(samples * 32767).astype(np.int16) != 0).mean() > 0.5


def test_thinker_listens(model, processor) -> None:
    outputs = {name: _generate(model, processor, name, return_audio=False)[0]
               for name in ("speech_en_single.wav", "silence_2s.wav", "noise_only.wav")}
    speech, silence, noise = outputs.values()
    assert speech != silence and speech != noise and silence != noise


def test_bridge_only_loading_holds_the_same_weights_as_the_full_model(tiny_checkpoint: Path, tiny_loaded) -> None:
    from vllm_omni.models.qwen3_omni.checkpoint import load_checkpoint
    from vllm_omni.models.qwen3_omni.messages import ThinkerPrefill
    from vllm_omni.models.qwen3_omni.talker_bridge import ThinkerToTalkerBridge

    light = load_checkpoint(tiny_checkpoint, bridge_only=True)
    assert light.model is None
    assert torch.equal(light.thinker.get_input_embeddings().weight, tiny_loaded.thinker.get_input_embeddings().weight)
    assert torch.equal(light.talker.get_input_embeddings().weight, tiny_loaded.talker.get_input_embeddings().weight)
    full_code2wav = tiny_loaded.code2wav.state_dict()
    assert all(torch.equal(value, full_code2wav[name]) for name, value in light.code2wav.state_dict().items())
    codes = torch.randint(0, 2048, (1, 16, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(light.code2wav(codes), tiny_loaded.code2wav(codes))
    tokenizer = tiny_loaded.tokenizer
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                                         add_generation_prompt=True, tokenize=False))
    hidden = torch.randn(len(ids), tiny_loaded.config.thinker_config.text_config.hidden_size)
    prefill = ThinkerPrefill(first_token=ids[0], embeddings=hidden, accept_hidden=hidden)
    light_rows = ThinkerToTalkerBridge(light).prompt_embeddings(ids, prefill, "ethan")
    assert torch.equal(light_rows, ThinkerToTalkerBridge(tiny_loaded).prompt_embeddings(ids, prefill, "ethan"))
