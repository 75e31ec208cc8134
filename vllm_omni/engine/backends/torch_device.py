"""The device of a torch-backend stage: its `torch_device` and `devices` (config/schema.py)."""

from __future__ import annotations

import torch

from vllm_omni.config import StageConfig


def stage_torch_device(stage: StageConfig) -> torch.device:
    """`cpu`, or `cuda:<devices[0]>` for `torch_device: cuda` (checked against the GPUs torch sees)."""
    if stage.torch_device == "cpu":
        return torch.device("cpu")
    where = f"stage {stage.stage_id} ({stage.role})"
    if not torch.cuda.is_available():
        raise RuntimeError(f"{where}: torch_device is cuda, but torch sees no CUDA GPU")
    index = stage.devices[0]
    if index >= torch.cuda.device_count():
        raise ValueError(f"{where}: device {index} is not visible (torch sees {torch.cuda.device_count()} GPUs)")
    return torch.device("cuda", index)
