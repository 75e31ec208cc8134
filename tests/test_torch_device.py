"""A torch stage's device: `torch_device` and `devices` (config/schema.py), without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vllm_omni.config import ConfigError, StageConfig, get_deploy_config_path, load_deploy_config
from vllm_omni.engine.backends.torch_device import stage_torch_device


def stage(**fields) -> StageConfig:
    return StageConfig(stage_id=0, role="thinker", backend="torch", **fields)


def test_cpu_is_the_default_whatever_the_devices() -> None:
    assert stage().torch_device == "cpu"
    assert stage_torch_device(stage(devices=[3])) == torch.device("cpu")


def test_cuda_takes_the_first_of_the_stage_devices(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert stage_torch_device(stage(torch_device="cuda", devices=[1])) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="device 2 is not visible"):
        stage_torch_device(stage(torch_device="cuda", devices=[2]))


def test_cuda_without_a_gpu_is_an_error(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"stage 0 \(thinker\): torch_device is cuda"):
        stage_torch_device(stage(torch_device="cuda"))


def test_a_vllm_stage_refuses_torch_device(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(f"base_config: {get_deploy_config_path('qwen3_omni_tiny_gpu')}\n"
                    "stages:\n  - stage_id: 0\n    torch_device: cuda\n")
    with pytest.raises(ConfigError, match=r"stages\[0\]\.torch_device: needs backend 'torch'"):
        load_deploy_config(path, platform="cuda")


def test_the_gpu_torch_config_puts_every_stage_on_gpu_0_as_the_cpu_reference() -> None:
    gpu = load_deploy_config(get_deploy_config_path("qwen3_omni_tiny_gpu_torch"), platform="cuda")
    cpu = load_deploy_config(get_deploy_config_path("qwen3_omni_tiny_cpu_torch"), platform="cpu")
    assert [(s.backend, s.torch_device, s.devices) for s in gpu.stages] == [("torch", "cuda", [0])] * 3
    assert [s.engine_args.dtype for s in gpu.stages] == [s.engine_args.dtype for s in cpu.stages] == ["float32"] * 3
    assert all(s.default_sampling_params.temperature == 0.0 for s in gpu.stages)
    assert gpu.connectors == cpu.connectors
