"""`worker_cls` values for Qwen2.5-Omni's thinker engine: `Capture{CPU,GPU}Worker` (built on
first use by `engine/backends/vllm/workers.py`)."""

from __future__ import annotations

from vllm_omni.engine.backends.vllm.workers import worker_class_path, worker_namespace

__getattr__ = worker_namespace(__name__, {
    "Capture": "vllm_omni.models.qwen2_5_omni.vllm_backend.capture:ReplyCaptureWorkerMixin",
})


def capture_worker_path(cpu: bool) -> str:
    return worker_class_path(__name__, "Capture", cpu)
