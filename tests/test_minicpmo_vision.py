"""MiniCPM-o's frame path: the resize rule, the patch position rows, the resampler's 2-D
positions, and a frame's 64 rows on the tiny checkpoint."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
from PIL import Image

from vllm_omni.models.minicpmo.vision import FrameEncoder, frame_size, position_ids, preprocess, sincos_2d


@pytest.mark.parametrize(("size", "resized"), [
    ((640, 480), (518, 392)), ((1280, 720), (602, 336)), ((1920, 1080), (602, 336)), ((448, 448), (448, 448)),
    ((3000, 400), (1218, 168)),
])
def test_frames_are_resized_to_about_448_squared_in_whole_patches(size, resized) -> None:
    assert frame_size(*size) == resized


def test_patch_positions_bucket_each_fraction_into_70_rows_and_columns() -> None:
    for rows, columns in ((32, 32), (28, 37), (24, 43), (12, 87), (25, 49)):
        ids = position_ids(rows, columns, 70).reshape(rows, columns)
        expected_rows = [math.floor(70 * i / rows) for i in range(rows)]
        expected_columns = [math.floor(70 * j / columns) for j in range(columns)]
        assert (ids // 70)[:, 0].tolist() == expected_rows and (ids % 70)[0].tolist() == expected_columns


def test_the_resampler_positions_encode_column_then_row() -> None:
    table = sincos_2d(128, rows=3, columns=5).reshape(3, 5, 128)
    assert torch.equal(table[0, :, :64], table[2, :, :64])  # the first half: the column only
    assert torch.equal(table[:, 0, 64:], table[:, 4, 64:])  # the second half: the row only
    assert torch.allclose(table[0, 1, :32], torch.sin(1.0 / 10000 ** (torch.arange(32) / 32)))


def test_a_frame_becomes_64_rows_that_depend_on_it(minicpmo_checkpoint: Path) -> None:
    encoder = FrameEncoder.from_checkpoint(minicpmo_checkpoint)
    rows = []
    for color in ((200, 30, 30), (30, 30, 200)):
        out = io.BytesIO()
        Image.new("RGB", (640, 480), color).save(out, "PNG")
        pixels = preprocess(out.getvalue())
        assert pixels.shape == (3, 392, 518) and pixels.min() >= -1 and pixels.max() <= 1
        rows.append(encoder(pixels))
    assert rows[0].shape == (64, 128) and not torch.allclose(rows[0], rows[1])
