"""Worker classes that give vLLM's model runner an extension, without patching vLLM.

vLLM imports `worker_cls` by its qualified name where the model runs (a worker process, or
the EngineCore process on one device), so a family's workers module exposes names like
`CaptureCPUWorker` through `worker_namespace`: each name builds its class on first use from
the family's worker mixin (given by import path, so nothing of the family is imported until
a worker asks) and the platform's vLLM worker. The mixin's `init_device` (from
`RunnerExtensionWorkerMixin`) turns the model runner into a subclass carrying the runner
extension (`runner_mixin`); the same mixin serves CPU and GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

PLATFORMS = ("CPU", "GPU")


class RunnerExtensionWorkerMixin:
    runner_mixin: type
    model_runner: Any

    def init_device(self) -> None:
        super().init_device()  # type: ignore[misc]
        runner_cls = type(self.model_runner)
        name = self.runner_mixin.__name__.strip("_") + runner_cls.__name__
        self.model_runner.__class__ = type(name, (self.runner_mixin, runner_cls), {})


def platform_worker(platform: str) -> type:
    if platform == "CPU":
        from vllm.v1.worker.cpu_worker import CPUWorker

        return CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    return Worker


def _load(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def worker_namespace(module: str, mixins: dict[str, str]) -> Callable[[str], type]:
    """The `__getattr__` of `module`, resolving `<Kind><Platform>Worker` for each kind in
    `mixins` (kind -> "module:MixinClass"); the classes belong to `module`, so they pickle
    by reference to it."""

    def resolve(name: str) -> type:
        for kind, path in mixins.items():
            for platform in PLATFORMS:
                if name == f"{kind}{platform}Worker":
                    return type(name, (_load(path), platform_worker(platform)), {"__module__": module})
        raise AttributeError(name)

    return resolve


def worker_class_path(module: str, kind: str, cpu: bool) -> str:
    return f"{module}.{kind}{'CPU' if cpu else 'GPU'}Worker"
