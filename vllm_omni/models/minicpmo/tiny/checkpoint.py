"""Build the tiny MiniCPM-o 4.5 checkpoint: config, tokenizer, preprocessor config and random
weights under the real checkpoint's key names (docs/minicpmo.md).

The language model, vision tower and audio encoder are transformers' own classes (Qwen3,
Idefics2's SigLIP-style vision transformer, Whisper's encoder), the rest are this project's
modules (models/minicpmo/modules.py). Every weight is set from one seeded generator
(models/tiny_weights.py): the same seed gives byte-identical files. The vision tower keeps
only the layers the model uses (`drop_vision_last_layer`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import GenerationConfig, Qwen3ForCausalLM
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from vllm_omni.models.minicpmo.config import MiniCPMOConfig
from vllm_omni.models.minicpmo.modules import MiniCPMTTS, MLPProjector, ResamplerWeights, vision_tower
from vllm_omni.models.minicpmo.tiny.config import ENDOFTEXT, IM_END, tiny_config
from vllm_omni.models.minicpmo.tiny.token2wav import build_tiny_token2wav
from vllm_omni.models.minicpmo.tiny.tokenizer import save_tokenizer_files
from vllm_omni.models.minicpmo.token2wav import ASSETS_DIR
from vllm_omni.models.tiny_weights import check_weights, initialise_parameters

WEIGHTS_FILE = "model.safetensors"
# Matrices with std = gain / sqrt(fan_in), by name prefix (first match). The audio stem is
# He-initialised so the encoder keeps the mel signal above its position table (the model
# listens); the talker's weight-norm magnitudes start near 1 so its logits are not flat.
_FAN_IN_GAINS = {
    "apm.conv": math.sqrt(2.0),
    "tts.head_code.0.parametrizations.weight.original0": 1.0,
}
_NORM_NAMES = ("norm", "ln_", "layer_norm", "layernorm")


def _vector_value(name: str, param: nn.Parameter) -> float:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias" or leaf.endswith("_bias"):
        return 0.0
    if leaf == "weight" and any(part in name for part in _NORM_NAMES):
        return 1.0
    raise ValueError(f"no initialisation rule for per-channel parameter {name} {tuple(param.shape)}")


class MiniCPMOWeights(nn.Module):
    """Every part of the checkpoint under its key prefix."""

    def __init__(self, config: MiniCPMOConfig):
        super().__init__()
        self.llm = Qwen3ForCausalLM(config)
        self.vpm = vision_tower(config)
        self.resampler = ResamplerWeights(config)
        self.apm = WhisperEncoder(config.audio_config)
        self.audio_projection_layer = MLPProjector(config.audio_config.encoder_ffn_dim // 4, config.hidden_size)
        self.tts = MiniCPMTTS(config.tts_config)


def build_weights(config: MiniCPMOConfig, seed: int) -> MiniCPMOWeights:
    torch.manual_seed(seed)
    weights = MiniCPMOWeights(config).eval()
    initialise_parameters(weights, seed, _vector_value, _FAN_IN_GAINS)
    check_weights(weights, "tiny checkpoint")
    return weights


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0) -> Path:
    """Write config.json, generation_config.json, model.safetensors, the tokenizer files,
    preprocessor_config.json and the token2wav assets (assets/token2wav/) to `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config()
    weights = build_weights(config, seed)
    state = {name: tensor.detach().contiguous() for name, tensor in weights.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config.save_pretrained(str(out))
    GenerationConfig(bos_token_id=ENDOFTEXT, eos_token_id=[IM_END, ENDOFTEXT],
                     pad_token_id=ENDOFTEXT).save_pretrained(str(out))
    save_tokenizer_files(config, out)
    build_tiny_token2wav(out / ASSETS_DIR, seed)
    return out
