"""`worker_cls` values for the thinker engine, one per platform (imported by vLLM's worker
processes by name, so each imports only its own platform's worker)."""

from __future__ import annotations

from vllm_omni.models.qwen3_omni.vllm_capture import CaptureWorkerMixin


def __getattr__(name: str):
    if name == "CaptureCPUWorker":
        from vllm.v1.worker.cpu_worker import CPUWorker

        return type("CaptureCPUWorker", (CaptureWorkerMixin, CPUWorker), {})
    if name == "CaptureGPUWorker":
        from vllm.v1.worker.gpu_worker import Worker

        return type("CaptureGPUWorker", (CaptureWorkerMixin, Worker), {})
    raise AttributeError(name)
