"""Mimi's transformers (the encoder's and the decoder's), a frame's positions per session per
step, sessions batched (docs/moshi.md, "Mimi streaming").

As in the temporal transformer (temporal.py), each session owns a slot of a preallocated KV
pool: per layer, a ring of `sliding_window + positions per step` entries, so that the first
position of a step still sees the oldest key its window holds. Each ring entry remembers its
position; a query at position p sees the keys at positions p - window < k <= p, as
transformers' sliding-window mask does. The layers are transformers' own modules; only the cache
layout and the batching are this module's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.mimi.modeling_mimi import MimiTransformerModel, apply_rotary_pos_emb

EMPTY = -1  # the position of a ring entry nothing was written to


class BatchedMimiTransformer:
    """`step`: the next positions of a batch of sessions' streams, each in its own slot."""

    def __init__(self, transformer: MimiTransformerModel, slots: int, step_positions: int = 2):
        self.transformer = transformer
        config = transformer.config
        self.window = config.sliding_window
        self.capacity = self.window + step_positions
        self.kv_groups = config.num_attention_heads // config.num_key_value_heads
        self.head_dim = config.head_dim
        weight = transformer.layers[0].self_attn.k_proj.weight
        shape = (len(transformer.layers), slots, config.num_key_value_heads, self.capacity, config.head_dim)
        self.keys = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.values = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.positions = torch.full((slots, self.capacity), EMPTY, dtype=torch.long, device=weight.device)

    def reset(self, slot: int) -> None:
        """Forget what the slot holds (a new stream starts there)."""
        self.positions[slot] = EMPTY

    @torch.inference_mode()
    def step(self, hidden: torch.Tensor, slots: list[int], starts: list[int]) -> torch.Tensor:
        """`hidden` [B, T, hidden]: each session's next T positions, from its `starts`; the last
        layer's output, same shape."""
        batch, count = hidden.shape[:2]
        device = hidden.device
        slot_index = torch.tensor(slots, device=device)
        position = torch.tensor(starts, device=device).view(-1, 1) + torch.arange(count, device=device)  # [B, T]
        ring = position % self.capacity
        self.positions[slot_index.view(-1, 1), ring] = position
        seen = self.positions[slot_index].view(batch, 1, 1, -1)  # [B, 1, 1, capacity]
        query_at = position.view(batch, 1, count, 1)
        visible = (seen >= 0) & (seen <= query_at) & (seen > query_at - self.window)
        cos, sin = self.transformer.rotary_emb(hidden, position)
        for index, layer in enumerate(self.transformer.layers):
            attn = layer.self_attn
            normed = layer.input_layernorm(hidden)
            shape = (batch, count, -1, self.head_dim)
            query = attn.q_proj(normed).view(shape).transpose(1, 2)
            key = attn.k_proj(normed).view(shape).transpose(1, 2)
            value = attn.v_proj(normed).view(shape).transpose(1, 2)
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
            layer_keys, layer_values = self.keys[index], self.values[index]
            layer_keys[slot_index.view(-1, 1), :, ring] = key.transpose(1, 2)
            layer_values[slot_index.view(-1, 1), :, ring] = value.transpose(1, 2)
            keys = layer_keys[slot_index].repeat_interleave(self.kv_groups, 1)
            values = layer_values[slot_index].repeat_interleave(self.kv_groups, 1)
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=visible, scale=attn.scaling)
            hidden = hidden + layer.self_attn_layer_scale(attn.o_proj(out.transpose(1, 2).reshape(batch, count, -1)))
            hidden = hidden + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
        return hidden
