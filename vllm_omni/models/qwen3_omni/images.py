"""Image input of Qwen3-Omni's thinker: encoded bytes through the checkpoint's own image processor.

The checkpoint's saved image processor (`Qwen2VLImageProcessor`) gives the patches the
vision encoder takes (`pixel_values`) and their grid (`image_grid_thw`); an image fills
grid.prod() / merge_size² `<|image_pad|>` positions, as the checkpoint's processor expands
them. vLLM's thinker takes the decoded image and runs the same processor itself.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError

FORMATS = ("PNG", "JPEG")


@dataclass(frozen=True)
class ThinkerImage:
    image: Image.Image  # decoded, as the image processor takes it
    pixel_values: torch.Tensor  # [patches, channels * temporal_patch * patch * patch]
    grid_thw: torch.Tensor  # [3]: patches along time, height, width
    num_tokens: int  # `<|image_pad|>` positions the image fills in the prompt


def decode_image(image_processor: Any, data: bytes) -> ThinkerImage:
    """Raises ValueError naming the problem when `data` is not a PNG or JPEG image the
    processor takes."""
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
        image.load()  # decode now: truncated or corrupt data fails here, not in a stage
    except UnidentifiedImageError:
        raise ValueError("not a PNG or JPEG image") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ValueError(f"the image cannot be decoded: {exc}") from None
    try:
        processed = image_processor(images=[image], return_tensors="pt")
    except ValueError as exc:  # e.g. an extreme aspect ratio
        raise ValueError(f"the image processor refuses the {image.width}x{image.height} image: {exc}") from None
    grid = processed["image_grid_thw"][0]
    return ThinkerImage(image=image, pixel_values=processed["pixel_values"], grid_thw=grid,
                        num_tokens=int(grid.prod()) // image_processor.merge_size ** 2)
