"""Build a tiny random-weight Qwen2.5-Omni checkpoint with transformers' own classes.

Every weight is set explicitly from one seeded generator (models/tiny_weights.py), so the
same seed gives byte-identical safetensors; `spk_dict.pt` (the speakers transformers'
`Qwen2_5OmniForConditionalGeneration.from_pretrained` requires) is drawn from a generator
seeded the same way, and torch.save writes it byte-stably (fixed zip timestamps, records in
order, a content-derived serialization id). Two rules matter for the tests built on it:

* With the usual std-0.02 init the audio conv stem shrinks the mel signal far below the
  positional embeddings and the thinker cannot tell speech from silence; the stem is
  He-initialised (gain sqrt 2) so the model listens.
* BigVGAN's level depends steeply on its convolutions' gain; BIGVGAN_GAIN and
  BIGVGAN_OUTPUT_GAIN put a decode of random codes at speech-like levels (see the constants).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

from vllm_omni.models.qwen2_5_omni.tiny.config import SPEAKER_BOS, tiny_config
from vllm_omni.models.qwen2_5_omni.tiny.tokenizer import save_processor
from vllm_omni.models.tiny_weights import check_weights, initialise_parameters

SPEAKERS_FILE = "spk_dict.pt"
REF_MEL_FRAMES = 400  # as in the real spk_dict.pt: ref_mel (1, 400, 80), cond (1, 192 = enc_emb_dim)

# Per-channel parameters and the value each starts at, by the last part of their name.
_VECTOR_INIT = {
    "bias": 0.0,
    "alpha": 0.0,  # SnakeBeta keeps log-scale alpha/beta (forward takes exp): exp(0) = 1
    "beta": 0.0,
}
# BigVGAN (64 → 1 channels over six upsampling stages, about twenty convolutions deep) has a
# steep, seed-dependent level in a uniform gain: a decode of random codes is near-silent at
# 0.5, peaks about 0.07-0.12 at 0.7 and clips at 0.85. So the stack gets 0.7 and the level is
# set by the last, linear convolution alone: 2.8 there gives peaks 0.26-0.50 for seeds 0-3
# (0.26 for seed 0), with no clipping and no DC offset.
BIGVGAN_GAIN = 0.7
BIGVGAN_OUTPUT_GAIN = 2.8
# Matrices initialised with std = gain / sqrt(fan_in), by name prefix (the first match counts).
_FAN_IN_GAINS = {
    "thinker.audio_tower.conv1": math.sqrt(2.0),
    "thinker.audio_tower.conv2": math.sqrt(2.0),
    "token2wav.code2wav_bigvgan_model.conv_post": BIGVGAN_OUTPUT_GAIN,
    "token2wav.code2wav_bigvgan_model.": BIGVGAN_GAIN,
}


def _vector_value(name: str, param: torch.nn.Parameter) -> float:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in _VECTOR_INIT:
        return _VECTOR_INIT[leaf]
    if leaf == "weight" and ("norm" in name or ".ln_" in name):
        return 1.0
    raise ValueError(f"no initialisation rule for per-channel parameter {name} {tuple(param.shape)}")


def initialise_weights(model: Qwen2_5OmniForConditionalGeneration, seed: int) -> None:
    """Set every parameter from a generator seeded with `seed` (see module docstring)."""
    initialise_parameters(model, seed, _vector_value, _FAN_IN_GAINS)


def speaker_dict(config: Qwen2_5OmniConfig, seed: int) -> dict[str, dict[str, int | torch.Tensor]]:
    """The real spk_dict.pt's layout: speaker → {"bos_token": the talker's text-stream start id
    (thinker vocabulary), "cond": (1, enc_emb_dim) speaker embedding (the DiT's
    `speaker_embedding`), "ref_mel": (1, frames, mel_dim) log-mel reference (the DiT's
    `condition_vector`, read by its ECAPA speaker encoder)}."""
    dit = config.token2wav_config.dit_config
    generator = torch.Generator().manual_seed(seed)
    speakers: dict[str, dict[str, int | torch.Tensor]] = {}
    for name in sorted(SPEAKER_BOS):
        cond = torch.randn(1, dit.enc_emb_dim, generator=generator)
        # Natural-log mel amplitudes around the real references' level (quiet speech).
        ref_mel = torch.randn(1, REF_MEL_FRAMES, dit.mel_dim, generator=generator) - 5.0
        speakers[name] = {"bos_token": SPEAKER_BOS[name], "cond": cond, "ref_mel": ref_mel}
    return speakers


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0) -> Path:
    """Write config, generation config, weights, speakers, tokenizer and processor files to `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config()
    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    initialise_weights(model, seed)
    check_weights(model, "tiny Qwen2.5-Omni checkpoint")
    model.save_pretrained(str(out))
    torch.save(speaker_dict(config, seed), out / SPEAKERS_FILE)
    save_processor(config, out)
    return out
