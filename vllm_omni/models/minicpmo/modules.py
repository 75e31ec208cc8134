"""MiniCPM-o 4.5's own modules, by the checkpoint's key names (docs/minicpmo.md).

Besides the language model (Qwen3), the SigLIP vision tower and the Whisper audio encoder,
which exist in transformers and vLLM, the checkpoint holds:

* `audio_projection_layer`: an MLP (Whisper width → LLM hidden → LLM hidden, ReLU between);
* `resampler`: 64 learned queries attending over the vision tower's patches (the weights'
  layout here; vLLM's `Resampler4_5` runs it);
* `tts`: the talker, a Llama decoder that turns the LLM's text and hidden states into codec
  codes: `emb_text` (rows indexed by LLM token ids), `projector_semantic` (hidden states into
  the talker's width), `emb_code` / `head_code` (codec embeddings and the weight-normed
  logits head), and `projector_spk` (present in the checkpoint, unused by the duplex path).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel
from transformers.models.idefics2.configuration_idefics2 import Idefics2VisionConfig
from transformers.models.idefics2.modeling_idefics2 import Idefics2VisionTransformer

from vllm_omni.models.minicpmo.config import MiniCPMOConfig, MiniCPMTTSConfig


def vision_tower(config: MiniCPMOConfig) -> Idefics2VisionTransformer:
    """`vpm`: the SigLIP tower as transformers' Idefics2 vision transformer (the same weights by
    the same names), with only the layers the model uses (`drop_vision_last_layer`)."""
    vision = config.vision_config
    used_layers = vision.num_hidden_layers - int(config.drop_vision_last_layer)
    return Idefics2VisionTransformer(Idefics2VisionConfig(**{
        **vision.to_dict(), "num_hidden_layers": used_layers, "model_type": "idefics2_vision"}))


class MLPProjector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear1 = nn.Linear(in_dim, out_dim)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.relu(self.linear1(x)))


class ResamplerWeights(nn.Module):
    """The resampler's parameters: `query` [Q, D], `kv_proj` (vision width → D, no bias),
    one multi-head attention (D // 128 heads), `ln_q` / `ln_kv` / `ln_post`, and `proj` [D, D]."""

    def __init__(self, config: MiniCPMOConfig):
        super().__init__()
        width, vision_width = config.hidden_size, config.vision_config.hidden_size
        self.query = nn.Parameter(torch.empty(config.query_num, width))
        self.kv_proj = nn.Linear(vision_width, width, bias=False)
        self.attn = nn.MultiheadAttention(width, width // 128)
        self.ln_q = nn.LayerNorm(width, eps=1e-6)
        self.ln_kv = nn.LayerNorm(width, eps=1e-6)
        self.ln_post = nn.LayerNorm(width, eps=1e-6)
        self.proj = nn.Parameter(torch.empty(width, width))


class MiniCPMTTS(nn.Module):
    def __init__(self, config: MiniCPMTTSConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(LlamaConfig(
            hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
            num_hidden_layers=config.num_hidden_layers, max_position_embeddings=config.max_position_embeddings,
            hidden_act=config.hidden_act, rms_norm_eps=config.rms_norm_eps))
        self.emb_text = nn.Embedding(config.num_text_tokens, config.hidden_size)
        self.projector_semantic = MLPProjector(config.llm_dim, config.hidden_size)
        self.projector_spk = MLPProjector(config.llm_dim, config.hidden_size)
        self.emb_code = nn.ModuleList(nn.Embedding(config.num_audio_tokens, config.hidden_size)
                                      for _ in range(config.num_vq))
        self.head_code = nn.ModuleList(
            nn.utils.parametrizations.weight_norm(nn.Linear(config.hidden_size, config.num_audio_tokens, bias=False))
            for _ in range(config.num_vq))
