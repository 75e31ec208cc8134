"""Build the tiny Moshi checkpoint: transformers' `MoshiForConditionalGeneration` (temporal
transformer, depth decoder, Mimi codec) at tiny widths, in the real `kmhf/hf-moshiko` key
layout, with a tokenizer that keeps the real special ids (docs/moshi.md, "Tiny checkpoint").

Token ids and vocabularies are the real ones (32 000 text ids, 2048 codes per codebook,
8 codebooks per stream); Mimi keeps its real strides (24 kHz in, 12.5 frames a second).
Every weight and codebook comes from one seeded generator: the same seed, the same bytes.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders
from tokenizers.models import WordLevel
from torch import nn
from transformers import GenerationConfig, MoshiConfig, MoshiForConditionalGeneration

from vllm_omni.models.moshi.text import PAD_ID
from vllm_omni.models.tiny_weights import check_weights, initialise_parameters

WEIGHTS_FILE = "model.safetensors"
TEXT_VOCAB = 32000
SPECIAL_PIECES = {0: "<unk>", 1: "<s>", 2: "</s>", PAD_ID: "<pad>"}  # sentencepiece's, as Moshi's tokenizer has them
# Mimi's convolutions are He-initialised so speech survives the SEANet stacks (the encoder
# hears, the decoder's output is audible); the rest are small normal matrices.
_FAN_IN_GAINS = {"audio_encoder.encoder.": math.sqrt(2.0), "audio_encoder.decoder.": math.sqrt(2.0)}
_LAYER_SCALE = 0.01
_NORM_NAMES = ("norm", "layernorm")


def tiny_config() -> MoshiConfig:
    return MoshiConfig(
        architectures=["MoshiForConditionalGeneration"], dtype="float32",
        vocab_size=TEXT_VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        head_dim=64, ffn_dim=512, max_position_embeddings=3000, sliding_window=3000, rms_norm_eps=1e-8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, num_codebooks=8, audio_vocab_size=2048,
        audio_encoder_config={
            "model_type": "mimi", "hidden_size": 64, "num_filters": 8, "codebook_size": 2048, "codebook_dim": 32,
            "vector_quantization_hidden_dimension": 32, "num_quantizers": 8, "num_semantic_quantizers": 1,
            "upsample_groups": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 1,
            "num_key_value_heads": 1, "head_dim": 64, "sliding_window": 250, "max_position_embeddings": 8000},
        depth_decoder_config={"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 64,
                              "ffn_dim": 256, "max_position_embeddings": 9, "sliding_window": 8, "rms_norm_eps": 1e-8})


def _vector_value(name: str, param: nn.Parameter) -> float:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return 0.0
    if leaf == "scale":
        return _LAYER_SCALE
    if leaf == "weight" and any(part in name for part in _NORM_NAMES):
        return 1.0
    raise ValueError(f"no initialisation rule for per-channel parameter {name} {tuple(param.shape)}")


@torch.no_grad()
def _seed_codebooks(model: nn.Module, seed: int) -> None:
    """Mimi's codebooks are buffers (sums over usage counts): unit-scale random centroids."""
    generator = torch.Generator().manual_seed(seed + 1)
    for name, buffer in sorted(model.named_buffers()):
        if name.endswith("codebook.embed_sum"):
            buffer.copy_(torch.randn(buffer.shape, generator=generator))
        elif name.endswith("codebook.cluster_usage"):
            buffer.fill_(1.0)


def tokenizer() -> Tokenizer:
    """A word-level vocabulary of the real size: the special pieces at their real ids, every other
    id a filler word ("▁t<id>") so any id a random model picks decodes to a word."""
    vocab = {SPECIAL_PIECES.get(i, f"▁t{i}"): i for i in range(TEXT_VOCAB)}
    built = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    built.decoder = decoders.Metaspace()
    return built


def build_weights(seed: int) -> MoshiForConditionalGeneration:
    """The tiny model, every weight and codebook set from `seed`."""
    torch.manual_seed(seed)
    model = MoshiForConditionalGeneration(tiny_config()).eval()
    initialise_parameters(model, seed, _vector_value, _FAN_IN_GAINS)
    _seed_codebooks(model, seed)
    check_weights(model, "tiny Moshi")
    return model


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0) -> Path:
    """Write config.json, generation_config.json, model.safetensors and tokenizer.json to `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = build_weights(seed)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(dict(sorted(state.items())), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    model.config.to_json_file(str(out / "config.json"), use_diff=False)
    GenerationConfig(do_sample=False).to_json_file(str(out / "generation_config.json"))
    tokenizer().save(str(out / "tokenizer.json"))
    return out
