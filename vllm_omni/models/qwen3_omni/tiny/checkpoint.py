"""Build a tiny random-weight Qwen3-Omni-MoE checkpoint with transformers' own classes.

Every weight is set explicitly from one seeded generator (models/tiny_weights.py), so the
same seed gives byte-identical safetensors. Two rules matter for the tests built on it:

* transformers 5.19 leaves the talker's MoE experts as `torch.empty` and its router at
  zero; a checkpoint built from the constructor alone is neither deterministic nor usable.
* With the usual std-0.02 init the audio conv stem shrinks the mel signal far below the
  positional embeddings, and the thinker answers speech, silence and noise alike. The
  stem and every other convolution are He-initialised so the model listens.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from vllm_omni.models.qwen3_omni.tiny.config import tiny_config
from vllm_omni.models.qwen3_omni.tiny.tokenizer import save_processor
from vllm_omni.models.tiny_weights import check_weights, initialise_parameters

# Per-channel parameters and the value each starts at, by the last part of their name.
_VECTOR_INIT = {
    "bias": 0.0,
    "alpha": 0.0,  # SnakeBeta keeps log-scale alpha/beta: exp(0) = 1
    "beta": 0.0,
    "gamma": 1e-6,  # ConvNeXt layer scale
}
# Matrices initialised with std = gain / sqrt(fan_in), by name prefix. The audio stem gets
# He init (gain sqrt 2); code2wav's convolution stack is very sensitive to the gain: 0.75
# gives speech-like levels (peak about 0.3, no clipping) where 0.6 is near-silent and 0.85
# clips most samples.
_FAN_IN_GAINS = {
    "thinker.audio_tower.conv2d": math.sqrt(2.0),
    "thinker.audio_tower.conv_out": math.sqrt(2.0),
    "code2wav.upsample": 0.75,
    "code2wav.decoder": 0.75,
}


def _vector_value(name: str, param: torch.nn.Parameter, layer_scale: float) -> float:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in _VECTOR_INIT:
        return _VECTOR_INIT[leaf]
    if name.endswith("layer_scale.scale"):
        return layer_scale
    if leaf == "weight" and ("norm" in name or ".ln_" in name):
        return 1.0
    raise ValueError(f"no initialisation rule for per-channel parameter {name} {tuple(param.shape)}")


def initialise_weights(model: Qwen3OmniMoeForConditionalGeneration, seed: int) -> None:
    """Set every parameter from a generator seeded with `seed` (see module docstring)."""
    layer_scale = model.config.code2wav_config.layer_scale_initial_scale
    initialise_parameters(model, seed, lambda name, param: _vector_value(name, param, layer_scale), _FAN_IN_GAINS)


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0) -> Path:
    """Write config, generation config, weights, tokenizer and processor files to `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config()
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    initialise_weights(model, seed)
    check_weights(model, "tiny checkpoint")
    model.save_pretrained(str(out))
    save_processor(config, out)
    return out
