"""A vLLM scheduler that lets chosen running requests sit out steps, and playback pacing
(engine/pacing.py) as the first reason to hold one.

Held requests leave `running` for the duration of `schedule()` (and count against
`max_num_seqs` and vLLM's admission limit, so no new request takes their place) and come back at the front, keeping
their KV blocks; holding changes when a request's tokens are computed, never what they
are. When nothing at all could run, the scheduler pauses 1 ms instead of letting the engine
loop spin. Subclasses add reasons with `_held` (the talker's text gate). Selected with
`scheduler_cls` (a class path).

The scheduler runs in the EngineCore process. So does the model on a single device
(`PacedInProcessExecutor`, on CPU too, where vLLM itself would start a worker process);
with several devices it runs in worker processes (`PacedExecutor`). The driver sends each
pacing snapshot with `collective_rpc("omni_pace", ...)`: either executor (selected with
`distributed_executor_backend`) keeps it in the EngineCore's `PACE` and answers the call
itself; the model never sees it. Both executors also apply the stage's `nice`
(`apply_nice`) before anything else starts in the engine's process.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.platforms import current_platform
from vllm.utils.ompmultiprocessing import OMPProcessManager
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.executor.multiproc_executor import MultiprocExecutor
from vllm.v1.executor.uniproc_executor import UniProcExecutor

from vllm_omni.engine.pacing import PaceSnapshot

IDLE_PAUSE_S = 0.001
PACE_RPC = "omni_pace"
NICE_KEY = "omni_nice"  # in vLLM's additional_config: the stage's `nice`


def external_request_id(internal_id: str) -> str:
    """The id the orchestrator used: vLLM appends `-` and 8 random characters."""
    head, sep, tail = internal_id.rpartition("-")
    return head if sep and len(tail) == 8 else internal_id


def rpc_args(args: tuple, kwargs: dict[str, Any]) -> tuple:
    """The call arguments of an executor `collective_rpc(method, timeout, args, ...)` call."""
    return kwargs.get("args", args[1] if len(args) > 1 else ())


class PaceBoard:
    """The EngineCore's copy of the latest pacing snapshot (none: nothing is held)."""

    def __init__(self) -> None:
        self.snapshot: PaceSnapshot | None = None

    def yielding(self, request_ids: list[str]) -> set[str]:
        return set() if self.snapshot is None else self.snapshot.yielding(request_ids)


PACE = PaceBoard()


class _HoldingMixin:
    running: list
    waiting: Any
    max_num_running_reqs: int
    max_num_active_reqs: int

    def _held(self, running: list) -> list:
        """Running requests that sit out this step: those playback pacing lets yield, unless
        a waiting request needs a seat (held requests keep theirs, so the new turn would
        wait for their playback instead of their generation)."""
        if self.waiting and len(running) >= self.max_num_active_reqs:
            return []
        yielding = PACE.yielding([external_request_id(r.request_id) for r in running])
        return [r for r in running if external_request_id(r.request_id) in yielding] if yielding else []

    def _shift_limits(self, by: int) -> None:
        """Both of vLLM's request limits: model-runner slots and admission into `running`."""
        self.max_num_running_reqs += by
        self.max_num_active_reqs += by

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        held = self._held(self.running)
        if not held:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        held_ids = {id(request) for request in held}
        self.running = [request for request in self.running if id(request) not in held_ids]
        self._shift_limits(-len(held))
        try:
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._shift_limits(len(held))
            self.running = held + self.running
        if output.total_num_scheduled_tokens == 0:
            time.sleep(IDLE_PAUSE_S)
        return output


class HoldingScheduler(_HoldingMixin, Scheduler):
    pass


class HoldingAsyncScheduler(_HoldingMixin, AsyncScheduler):
    pass


class _PaceCallMixin:
    def collective_rpc(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        if method == PACE_RPC:
            PACE.snapshot = PaceSnapshot.from_wire(*rpc_args(args, kwargs))
            return [None]
        return super().collective_rpc(method, *args, **kwargs)  # type: ignore[misc]


class PacedExecutor(_PaceCallMixin, MultiprocExecutor):
    def _init_executor(self) -> None:
        apply_nice(self.vllm_config)  # before the workers start: they inherit it
        super()._init_executor()


class PacedInProcessExecutor(_PaceCallMixin, UniProcExecutor):
    """The model runs in the EngineCore process, as vLLM runs one device on GPUs: no worker
    process, and no shared-memory queue between scheduler and model whose readers spin.
    On CPU the process takes the cores vLLM would have bound a worker to."""

    def _init_executor(self) -> None:
        apply_nice(self.vllm_config)
        if current_platform.is_cpu():
            bind_cpu_threads(self.vllm_config)
        super()._init_executor()


def apply_nice(vllm_config: VllmConfig) -> None:
    """The stage's `nice` (engine_kwargs puts it in `additional_config`) on the calling
    thread, and so on every thread and process it starts afterwards."""
    nice = vllm_config.additional_config.get(NICE_KEY, 0)
    if nice:
        os.nice(nice)


def bind_cpu_threads(vllm_config: VllmConfig) -> None:
    """The calling thread, and every thread it starts afterwards (the EngineCore starts its
    I/O threads after the executor), on the cores of vLLM's CPU binding
    (VLLM_CPU_OMP_THREADS_BIND), one torch thread per core; "nobind" leaves them alone."""
    binding = OMPProcessManager(vllm_config)
    if binding.skip_setup or not binding.cpu_lists:
        return
    cores = binding.cpu_lists[0]
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))


HOLDING_SCHEDULERS = (f"{__name__}.HoldingScheduler", f"{__name__}.HoldingAsyncScheduler")


PACED_EXECUTORS = (PacedExecutor, PacedInProcessExecutor)


def paced_engine_kwargs(kwargs: dict[str, Any], cpu: bool, schedulers: tuple[str, str] = HOLDING_SCHEDULERS,
                        executors: tuple[type, type] = PACED_EXECUTORS,
                        async_by_default: bool = True) -> dict[str, Any]:
    """`kwargs` with a holding scheduler (class paths: synchronous, asynchronous) and a
    pacing executor, unless the stage's config chose its own scheduler. Asynchronous
    scheduling where the stage asks for it or `async_by_default` (vLLM's own default on
    GPUs), never on CPU; vLLM is told which, so its engine loop matches the scheduler.
    The executor (multiprocess, in-process) is the in-process one for a single device, as
    vLLM chooses itself: on CPU too, where vLLM would always start a worker process."""
    if "scheduler_cls" not in kwargs:
        async_scheduling = bool(kwargs.get("async_scheduling", async_by_default)) and not cpu
        kwargs["scheduler_cls"] = schedulers[1] if async_scheduling else schedulers[0]
        kwargs["async_scheduling"] = async_scheduling
    single_device = kwargs.get("tensor_parallel_size", 1) * kwargs.get("pipeline_parallel_size", 1) == 1
    kwargs["distributed_executor_backend"] = executors[1] if single_device else executors[0]
    return kwargs
