"""`worker_cls` values for the Qwen3-Omni engines: `{Capture,Talker}{CPU,GPU}Worker`.

vLLM's worker processes import these by name, so each name builds its class on first use
and imports only its own platform's worker. Each is vLLM's worker with a mixin in front
whose `init_device` gives the model runner a subclass carrying the runner extension
(`runner_mixin`): no vLLM file is patched and the same mixin serves the CPU and GPU runner.
"""

from __future__ import annotations

from typing import Any


class RunnerExtensionWorkerMixin:
    runner_mixin: type
    model_runner: Any

    def init_device(self) -> None:
        super().init_device()  # type: ignore[misc]
        runner_cls = type(self.model_runner)
        name = self.runner_mixin.__name__.strip("_") + runner_cls.__name__
        self.model_runner.__class__ = type(name, (self.runner_mixin, runner_cls), {})


def _platform_worker(platform: str) -> type:
    if platform == "CPU":
        from vllm.v1.worker.cpu_worker import CPUWorker

        return CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    return Worker


def _role_mixin(role: str) -> type:
    if role == "Capture":
        from vllm_omni.models.qwen3_omni.vllm_capture import CaptureWorkerMixin

        return CaptureWorkerMixin
    from vllm_omni.models.qwen3_omni.vllm_talker_worker import TalkerWorkerMixin

    return TalkerWorkerMixin


def __getattr__(name: str) -> type:
    for role in ("Capture", "Talker"):
        for platform in ("CPU", "GPU"):
            if name == f"{role}{platform}Worker":
                return type(name, (_role_mixin(role), _platform_worker(platform)), {})
    raise AttributeError(name)


def worker_class_path(role: str, cpu: bool) -> str:
    return f"{__name__}.{role}{'CPU' if cpu else 'GPU'}Worker"
