"""Moshi's depth decoder for a batch of sessions (docs/moshi.md, "Batching"): from a frame's
temporal hidden state and its text token, the model's 8 codes, one codebook per position,
each position with its own weights (transformers' flexible linears, selected by codebook).

transformers' `MoshiDepthDecoder.generate` builds a cache and masks at every one of the 8
steps and selects each position's weights per call; here each position's weights are sliced
once (query, key and value fused), the at most 8 keys and values of a frame are plain tensors,
and every row attends over all of them (the positions so far are all visible). The norms and
the activation are transformers' own modules.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.models.moshi.modeling_moshi import MoshiDepthDecoder


class _Position:
    """One codebook position's weights, sliced out of the flexible linears once."""

    def __init__(self, depth: MoshiDepthDecoder, k: int):
        self.input_projection = depth.input_projections.weight[k]
        self.qkv = [torch.cat([layer.self_attn.q_proj.linear.weight[k], layer.self_attn.k_proj.linear.weight[k],
                               layer.self_attn.v_proj.linear.weight[k]]) for layer in depth.layers]
        self.out = [layer.self_attn.o_proj.linear.weight[k] for layer in depth.layers]
        self.fc1 = [layer.mlp.fc1.weight[k] for layer in depth.layers]
        self.fc2 = [layer.mlp.fc2.weight[k] for layer in depth.layers]
        self.head = depth.lm_heads.weight[k]


class BatchedDepth:
    def __init__(self, depth: MoshiDepthDecoder, num_codebooks: int):
        self.depth = depth
        config = depth.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.activation = depth.layers[0].mlp.activation_fn
        self._positions = [_Position(depth, k) for k in range(num_codebooks)]

    @torch.inference_mode()
    def codes(self, hidden: torch.Tensor, text: torch.Tensor,
              pick: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """`hidden` [B, 1, temporal hidden], `text` [B] → codes [B, num_codebooks]; `pick` turns
        a codebook's logits [B, audio vocab] into its ids [B]."""
        depth, rows = self.depth, hidden.shape[0]
        keys: list[list[torch.Tensor]] = [[] for _ in depth.layers]
        values: list[list[torch.Tensor]] = [[] for _ in depth.layers]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        token, codes = text.view(-1, 1), []
        for k, weights in enumerate(self._positions):
            embed = depth.text_embed_tokens(token) if k == 0 else depth.embed_tokens[k - 1](token)
            x = embed + F.linear(hidden, weights.input_projection)
            for i, layer in enumerate(depth.layers):
                query, key, value = F.linear(layer.input_layernorm(x), weights.qkv[i]).split(
                    [q_size, kv_size, kv_size], dim=-1)
                keys[i].append(key.view(rows, 1, self.kv_heads, self.head_dim).transpose(1, 2))
                values[i].append(value.view(rows, 1, self.kv_heads, self.head_dim).transpose(1, 2))
                out = F.scaled_dot_product_attention(
                    query.view(rows, 1, self.heads, self.head_dim).transpose(1, 2),
                    torch.cat(keys[i], 2), torch.cat(values[i], 2), scale=layer.self_attn.scaling,
                    enable_gqa=self.heads != self.kv_heads)
                x = x + F.linear(out.transpose(1, 2).reshape(rows, 1, -1), weights.out[i])
                gate, up = F.linear(layer.post_attention_layernorm(x), weights.fc1[i]).chunk(2, dim=-1)
                x = x + F.linear(self.activation(gate) * up, weights.fc2[i])
            token = pick(F.linear(x[:, -1], weights.head).float()).view(-1, 1)
            codes.append(token)
        return torch.cat(codes, dim=1)
