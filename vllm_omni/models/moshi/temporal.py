"""Moshi's temporal transformer, one position per session per step, sessions batched
(docs/moshi.md, "Batching").

Each session owns a slot of a preallocated KV pool: a ring of `window` positions per layer
(the model's sliding window, 3000 frames = 4 minutes for Moshi), written once per frame and
never re-prefilled. A step gathers its sessions' slots, attends over each one's filled
positions (masked per row) and writes the new keys and values back. The layers are
transformers' own modules; only the cache layout and the batching are this module's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.moshi.modeling_moshi import MoshiForCausalLM, apply_rotary_pos_emb


class SlotPool:
    """The KV ring of every session slot: keys and values [layers, slots, kv_heads, window, head_dim]."""

    def __init__(self, layers: int, slots: int, kv_heads: int, window: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        shape = (layers, slots, kv_heads, window, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.window = window
        self.free = list(range(slots))[::-1]

    def claim(self) -> int:
        if not self.free:
            raise RuntimeError(f"all {self.keys.shape[1]} session slots of the temporal transformer are in use")
        return self.free.pop()

    def release(self, slot: int) -> None:
        self.free.append(slot)


class BatchedTemporal:
    """`step`: one new position for each of a batch of sessions."""

    def __init__(self, decoder: MoshiForCausalLM, slots: int):
        self.model, self.lm_head = decoder.model, decoder.lm_head
        config = decoder.config
        self.kv_groups = config.num_attention_heads // config.num_key_value_heads
        weight = self.lm_head.weight
        self.pool = SlotPool(config.num_hidden_layers, slots, config.num_key_value_heads, config.sliding_window,
                             config.head_dim, weight.dtype, weight.device)

    @torch.inference_mode()
    def step(self, embeds: torch.Tensor, slots: list[int], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """`embeds` [B, 1, hidden] at each session's next `positions` → (the last layer's normed
        hidden state [B, 1, hidden], the text logits [B, vocab])."""
        device = embeds.device
        slot_index = torch.tensor(slots, device=device)
        position = torch.tensor(positions, device=device).view(-1, 1)
        ring = position.view(-1) % self.pool.window
        filled = torch.clamp(position + 1, max=self.pool.window)  # [B, 1]
        span = int(filled.max())  # ring entries any row of the batch has written
        visible = (torch.arange(span, device=device).view(1, -1) < filled).view(len(slots), 1, 1, span)
        hidden = embeds
        for index, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            normed = layer.input_layernorm(hidden)
            shape = (len(slots), 1, -1, attn.head_dim)
            query = attn.q_proj(normed).view(shape).transpose(1, 2)
            key = attn.k_proj(normed).view(shape).transpose(1, 2)
            value = attn.v_proj(normed).view(shape).transpose(1, 2)
            cos, sin = attn.rotary_emb(value, position)
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
            self.pool.keys[index, slot_index, :, ring] = key[:, :, 0]
            self.pool.values[index, slot_index, :, ring] = value[:, :, 0]
            keys = self.pool.keys[index, slot_index, :, :span]
            values = self.pool.values[index, slot_index, :, :span]
            out = F.scaled_dot_product_attention(query, keys.repeat_interleave(self.kv_groups, 1),
                                                 values.repeat_interleave(self.kv_groups, 1), attn_mask=visible,
                                                 scale=attn.scaling)
            hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(len(slots), 1, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = self.model.norm(hidden)
        return hidden, self.lm_head(hidden[:, -1]).float()
