"""`worker_cls` values for the Qwen3-Omni engines: `{Capture,Talker}{CPU,GPU}Worker`
(built on first use by `engine/backends/vllm/workers.py`)."""

from __future__ import annotations

from vllm_omni.engine.backends.vllm.workers import worker_class_path, worker_namespace

__getattr__ = worker_namespace(__name__, {
    "Capture": "vllm_omni.models.qwen3_omni.vllm_backend.capture:CaptureWorkerMixin",
    "Talker": "vllm_omni.models.qwen3_omni.vllm_backend.talker_worker:TalkerWorkerMixin",
})


def worker_path(kind: str, cpu: bool) -> str:
    return worker_class_path(__name__, kind, cpu)
