"""MiniCPM-o's streaming audio encoder: one unit's mel chunk in, the unit's 10 LLM rows out
(docs/minicpmo.md, "Audio units").

The Whisper encoder runs unit by unit, keeping each layer's keys and values of the frames
already encoded, so a unit's frames attend to themselves and to every earlier frame: the
same as encoding the whole clip with a 1 s chunk-causal mask, without re-encoding the past.
The convolution stem sees the chunk's redundancy frames and its outputs at redundant edges
are dropped, leaving 50 frames per unit at positions that continue from the cached ones.
When the cache would reach `max_source_positions` (1500 frames, 30 s), it starts over: the
encoder forgets earlier audio, the LLM's context keeps it. The 50 frames are projected into
the LLM's width and averaged five at a time into 10 rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from vllm_omni.models.minicpmo.config import MiniCPMOConfig
from vllm_omni.models.minicpmo.mel_stream import FRAMES_PER_UNIT, REDUNDANT_FRAMES
from vllm_omni.models.minicpmo.modules import MLPProjector

ENCODER_FRAMES_PER_UNIT = FRAMES_PER_UNIT // 2  # the stem's second convolution has stride 2
EDGE_OUTPUTS = REDUNDANT_FRAMES // 2  # encoder outputs a chunk's redundancy frames make on each edge


@dataclass
class AudioEncoderState:
    """One session's encoder cache: per layer, the keys and values [heads, frames, head_dim]."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    @property
    def cached_frames(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0

    def reset(self) -> None:
        self.keys.clear()
        self.values.clear()


class StreamingAudioEncoder(nn.Module):
    """`apm` (Whisper's encoder) and `audio_projection_layer` of the checkpoint, run per unit."""

    def __init__(self, audio_config: WhisperConfig, llm_hidden_size: int, pool_step: int):
        super().__init__()
        self.apm = WhisperEncoder(audio_config)
        self.audio_projection_layer = MLPProjector(audio_config.encoder_ffn_dim // 4, llm_hidden_size)
        self.pool = nn.AvgPool1d(pool_step, stride=pool_step)
        self.heads = audio_config.encoder_attention_heads

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> StreamingAudioEncoder:
        """The encoder with the checkpoint's `apm.*` and `audio_projection_layer.*` weights."""
        config = MiniCPMOConfig.from_pretrained(path)
        encoder = cls(config.audio_config, config.hidden_size, config.audio_pool_step).eval()
        weights = {name: tensor for name, tensor in load_file(Path(path) / "model.safetensors").items()
                   if name.startswith(("apm.", "audio_projection_layer."))}
        encoder.load_state_dict(weights, strict=True)
        return encoder

    @torch.no_grad()
    def encode_unit(self, mel: torch.Tensor, state: AudioEncoderState, first: bool) -> torch.Tensor:
        """The unit's LLM rows [10, hidden] from its mel chunk [80, frames] (`first`: unit 0,
        whose chunk has no left redundancy)."""
        hidden = self._stem(mel, first)
        if state.cached_frames + hidden.shape[0] >= self.apm.embed_positions.num_embeddings:
            state.reset()
        offset = state.cached_frames
        hidden = hidden + self.apm.embed_positions.weight[offset: offset + hidden.shape[0]]
        for index, layer in enumerate(self.apm.layers):
            hidden = self._layer(layer, hidden, state, index)
        hidden = self.apm.layer_norm(hidden)
        rows = self.audio_projection_layer(hidden)
        return self.pool(rows.T[None])[0].T

    def _stem(self, mel: torch.Tensor, first: bool) -> torch.Tensor:
        """The convolutions over the chunk, less the outputs at its redundant edges: [50, width]."""
        conv = nn.functional.gelu(self.apm.conv1(mel[None]))
        conv = nn.functional.gelu(self.apm.conv2(conv))[0].T
        start = 0 if first else EDGE_OUTPUTS
        return conv[start: start + ENCODER_FRAMES_PER_UNIT]

    def _layer(self, layer: nn.Module, hidden: torch.Tensor, state: AudioEncoderState, index: int) -> torch.Tensor:
        """A pre-norm encoder layer whose attention also sees the cached frames (and caches these)."""
        attention = layer.self_attn
        normed = layer.self_attn_layer_norm(hidden)
        query, key, value = (self._split(projection(normed)) for projection in
                             (attention.q_proj, attention.k_proj, attention.v_proj))
        if index < len(state.keys):
            state.keys[index] = torch.cat([state.keys[index], key], dim=1)
            state.values[index] = torch.cat([state.values[index], value], dim=1)
        else:
            state.keys.append(key)
            state.values.append(value)
        attended = nn.functional.scaled_dot_product_attention(query, state.keys[index], state.values[index])
        hidden = hidden + attention.out_proj(attended.transpose(0, 1).reshape(hidden.shape))
        return hidden + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))

    def _split(self, states: torch.Tensor) -> torch.Tensor:
        """[frames, width] → [heads, frames, head_dim]."""
        return states.view(states.shape[0], self.heads, -1).transpose(0, 1)
