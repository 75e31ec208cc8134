"""MiniCPM-o's view of a camera frame: one frame per unit, 64 LLM rows (docs/minicpmo.md, "Frames").

1. The frame is resized (bicubic, RGB) to about 448 × 448 pixels of its own aspect ratio, each
   side a multiple of the 14-pixel patch (h = int(448 / sqrt(W/H)), w = int(h * W/H), each
   rounded to a multiple of 14), and scaled to [-1, 1]. No HD slicing: one block per frame.
2. The vision tower (SigLIP, NaViT-style) embeds its h × w patches; patch (i, j) takes the
   position row bucket(i / h) * 70 + bucket(j / w), the fractions bucketed into the 70 rows
   and columns of the 980-pixel position table, then runs its layers and final norm.
3. The resampler's 64 queries attend over the patches (keys carry a 2-D sin-cos position of
   each patch: the first half of the channels encodes its column, the second its row) and
   project to the LLM's width.

In the context a frame is `<image>` + its 64 rows + `</image>`, before the unit's audio.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file
from torch import nn

from vllm_omni.models.minicpmo.config import MiniCPMOConfig
from vllm_omni.models.minicpmo.modules import ResamplerWeights, vision_tower

PATCH = 14
SCALE_RESOLUTION = 448


def _multiple_of_patch(length: float) -> int:
    return max(round(length / PATCH) * PATCH, PATCH)


def frame_size(width: int, height: int) -> tuple[int, int]:
    """The (width, height) a frame is resized to."""
    ratio = width / height
    h = int(SCALE_RESOLUTION / math.sqrt(ratio))
    return _multiple_of_patch(int(h * ratio)), _multiple_of_patch(h)


def preprocess(frame: bytes | Image.Image) -> torch.Tensor:
    """[3, H, W] float32 in [-1, 1]; H and W multiples of the patch."""
    image = Image.open(io.BytesIO(frame)) if isinstance(frame, bytes) else frame
    image = image.convert("RGB")
    image = image.resize(frame_size(*image.size), Image.Resampling.BICUBIC)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return (pixels - 0.5) / 0.5


def position_ids(rows: int, columns: int, buckets: int) -> torch.Tensor:
    """The position-table row of each patch, row-major."""
    boundaries = torch.arange(1 / buckets, 1.0, 1 / buckets)
    row = torch.bucketize(torch.arange(rows) / rows, boundaries, right=True)
    column = torch.bucketize(torch.arange(columns) / columns, boundaries, right=True)
    return (row[:, None] * buckets + column[None, :]).reshape(-1)


def sincos_2d(width: int, rows: int, columns: int) -> torch.Tensor:
    """[rows * columns, width]: per patch [sin(xω), cos(xω), sin(yω), cos(yω)], x its column and
    y its row, ω_k = 1 / 10000^(k / (width / 4))."""
    quarter = width // 4
    omega = 1.0 / 10000 ** (np.arange(quarter, dtype=np.float32) / quarter)
    y, x = np.meshgrid(np.arange(rows, dtype=np.float32), np.arange(columns, dtype=np.float32), indexing="ij")
    angles_x, angles_y = np.outer(x.reshape(-1), omega), np.outer(y.reshape(-1), omega)
    table = np.concatenate([np.sin(angles_x), np.cos(angles_x), np.sin(angles_y), np.cos(angles_y)], axis=1)
    return torch.from_numpy(table.astype(np.float32))


class FrameEncoder(nn.Module):
    """The checkpoint's `vpm` (a transformers Idefics2 vision transformer) and `resampler`."""

    def __init__(self, config: MiniCPMOConfig):
        super().__init__()
        self.vpm, self.resampler = vision_tower(config), ResamplerWeights(config)
        self.buckets = self.vpm.embeddings.num_patches_per_side

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> FrameEncoder:
        encoder = cls(MiniCPMOConfig.from_pretrained(path)).eval()
        encoder.load_state_dict({name: tensor for name, tensor in load_file(Path(path) / "model.safetensors").items()
                                 if name.startswith(("vpm.", "resampler."))}, strict=True)
        return encoder

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """A preprocessed frame [3, H, W] → its LLM rows [64, hidden]."""
        rows, columns = pixels.shape[1] // PATCH, pixels.shape[2] // PATCH
        embeddings = self.vpm.embeddings
        patches = embeddings.patch_embedding(pixels[None])[0].flatten(1).T  # [rows * columns, vision width]
        hidden = patches + embeddings.position_embedding(position_ids(rows, columns, self.buckets))
        hidden = self.vpm.post_layernorm(self.vpm.encoder(inputs_embeds=hidden[None]).last_hidden_state)[0]
        return self._resample(hidden, rows, columns)

    def _resample(self, patches: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
        resampler = self.resampler
        keys_values = resampler.ln_kv(resampler.kv_proj(patches))
        positions = sincos_2d(keys_values.shape[-1], rows, columns)
        queries = resampler.ln_q(resampler.query)
        attended, _ = resampler.attn(queries[:, None], (keys_values + positions)[:, None], keys_values[:, None],
                                     need_weights=False)
        return resampler.ln_post(attended[:, 0]) @ resampler.proj
