"""The tiny Moshi checkpoint (`vllm-omni make-tiny-model --arch moshi`): transformers' Moshi
architecture in the real key layout, the real vocabularies and special ids, deterministic, and
alive: Mimi hears speech and the model's speech is audible."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, MoshiForConditionalGeneration

from tests.conftest import read_fixture_pcm
from vllm_omni.audio.pcm import resample
from vllm_omni.models.moshi.text import EPAD_ID, PAD_ID, TextPieces
from vllm_omni.models.moshi.tiny.checkpoint import WEIGHTS_FILE

# transformers' key prefixes for the parts (as in kmhf/hf-moshiko's model.safetensors)
PARTS = ("decoder.model.layers.", "decoder.lm_head.", "depth_decoder.layers.", "depth_decoder.lm_heads.",
         "embed_tokens.15.", "audio_encoder.encoder.", "audio_encoder.decoder.",
         "audio_encoder.quantizer.acoustic_residual_vector_quantizer.layers.6.codebook.embed_sum")


def test_the_checkpoint_is_the_real_architecture(moshi_checkpoint: Path) -> None:
    config = AutoConfig.from_pretrained(moshi_checkpoint)
    assert (config.model_type, config.architectures) == ("moshi", ["MoshiForConditionalGeneration"])
    assert (config.vocab_size, config.audio_vocab_size, config.num_codebooks) == (32000, 2048, 8)
    assert config.head_dim >= 32 and config.audio_encoder_config.frame_rate == 12.5
    assert config.sampling_rate == 24000
    weights = load_file(moshi_checkpoint / WEIGHTS_FILE)
    assert all(any(key.startswith(part) for key in weights) for part in PARTS)
    model = MoshiForConditionalGeneration(config)
    assert set(model.state_dict()) == set(weights)  # nothing missing, nothing extra
    text = TextPieces(moshi_checkpoint)
    assert (text.piece(PAD_ID), text.piece(EPAD_ID), text.piece(1234)) == ("", "", " t1234")


def test_the_cli_builds_it_again_byte_for_byte(moshi_checkpoint: Path, tmp_path: Path) -> None:
    """`vllm-omni make-tiny-model --arch moshi` with the same seed writes the same bytes."""
    again = tmp_path / "again"
    result = subprocess.run([str(Path(sys.executable).parent / "vllm-omni"), "make-tiny-model", "--arch", "moshi",
                             "--out", str(again), "--seed", "0"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "wrote tiny moshi checkpoint" in result.stdout, result.stderr
    for name in (WEIGHTS_FILE, "config.json", "tokenizer.json"):
        assert hashlib.sha256((again / name).read_bytes()).digest() == \
            hashlib.sha256((moshi_checkpoint / name).read_bytes()).digest(), name


@torch.inference_mode()
def test_mimi_hears_speech_and_speaks_audibly(moshi_checkpoint: Path) -> None:
    mimi = MoshiForConditionalGeneration.from_pretrained(moshi_checkpoint, dtype=torch.float32).audio_encoder
    speech = torch.from_numpy(resample(read_fixture_pcm("speech_en_single.wav"), 16000, 24000)[:1920 * 25].copy())
    codes = mimi.encode(speech.view(1, 1, -1), num_quantizers=8)[0][0]
    silent = mimi.encode(torch.zeros(1, 1, 1920 * 25), num_quantizers=8)[0][0]
    assert len({tuple(frame) for frame in codes.T.tolist()}) >= 15 and not torch.equal(codes, silent)  # it hears
    audio = mimi.decode(codes[None]).audio_values[0, 0]
    assert 0.01 < audio.pow(2).mean().sqrt() < 0.5 and audio.abs().max() <= 1.5
