"""What every vLLM-served stage shares: AsyncLLM arguments from a stage's deploy config,
device pinning, sampling parameters, the platform check, and the engine driver base."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vllm_omni.config import SamplingParams, StageConfig
from vllm_omni.engine.pacing import PaceSnapshot

logger = logging.getLogger(__name__)

PASSED_THROUGH = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization",
                  "enforce_eager")


def cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def visible_device_ids(devices: list[int], outer: str | None) -> str:
    """The device-control value for a stage's `devices`, numbered as this process sees
    them: with an outer CUDA_VISIBLE_DEVICES=4,5,6 a stage on [1] gets "5"."""
    visible = [d for d in outer.split(",") if d] if outer else None
    if visible is None:
        return ",".join(str(d) for d in devices)
    unknown = [d for d in devices if d >= len(visible)]
    if unknown:
        raise ValueError(f"devices {unknown} are not visible (only {len(visible)}: {outer})")
    return ",".join(visible[d] for d in devices)


CPU_BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_bind_mask(cores: list[int], tensor_parallel_size: int) -> str:
    """vLLM's CPU thread binding for a stage on `cores`: the cores split
    evenly over the tensor-parallel ranks ("0,1|2,3" for two ranks on four cores)."""
    if len(cores) < tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size {tensor_parallel_size} needs as many cores, got {cores}")
    per_rank = len(cores) // tensor_parallel_size
    return "|".join(",".join(str(c) for c in cores[rank * per_rank:(rank + 1) * per_rank])
                    for rank in range(tensor_parallel_size))


@contextmanager
def _environment(variable: str, value: str) -> Iterator[None]:
    outer = os.environ.get(variable)
    os.environ[variable] = value
    try:
        yield
    finally:
        if outer is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = outer


@contextmanager
def stage_devices(stage: StageConfig) -> Iterator[None]:
    """Pin the engine processes started inside to the stage's devices (they inherit the
    environment). GPUs: the platform's device-control variable (CUDA_VISIBLE_DEVICES) from
    `devices`. CPU: the stage's `cpu_cores`, if set, so that engines on different cores do
    not share one (vLLM binds every engine to the same cores); an outer
    VLLM_CPU_OMP_THREADS_BIND wins."""
    binding = _stage_binding(stage)
    if binding is None:
        yield
        return
    with _environment(*binding):
        yield


def _stage_binding(stage: StageConfig) -> tuple[str, str] | None:
    """The (variable, value) that pins a stage's engine; None: leave the environment alone."""
    from vllm.platforms import current_platform

    tp = stage.engine_args.tensor_parallel_size
    try:
        if cpu_platform():
            if stage.cpu_cores is None or os.environ.get(CPU_BIND_VARIABLE):
                return None
            return CPU_BIND_VARIABLE, cpu_bind_mask(stage.cpu_cores, tp)
        if len(stage.devices) < tp:
            raise ValueError(f"tensor_parallel_size {tp} needs as many devices, got {stage.devices}")
        variable = current_platform.device_control_env_var
        return variable, visible_device_ids(stage.devices, os.environ.get(variable))
    except ValueError as exc:
        raise ValueError(f"stage {stage.stage_id} ({stage.role}): {exc}") from None


def engine_kwargs(stage: StageConfig, model: str, *, prefix_caching: bool = False, **defaults: Any) -> dict[str, Any]:
    """AsyncLLM keywords: `defaults`, then the stage's engine args, then its `extra`.

    vLLM's prefix caching runs no forward for a prompt's cached positions, so what a runner
    extension captures from the forward (hidden rows, per-step inputs) would not exist for
    them. `prefix_caching`: the driver's runner extension copes with that (the thinker's
    keeps the rows of cached prompts, capture.py); then prefix caching is on unless the
    stage's `enable_prefix_caching` turns it off, otherwise it is off and a stage asking for
    it is refused."""
    args = stage.engine_args
    if args.enable_prefix_caching and not prefix_caching:
        raise ValueError(f"stage {stage.stage_id} ({stage.role}) on vLLM: enable_prefix_caching must be off; "
                         "cached prompt positions are not recomputed, and this stage needs what their forward "
                         "would compute")
    caching = prefix_caching if args.enable_prefix_caching is None else args.enable_prefix_caching
    kwargs: dict[str, Any] = {"model": model, "dtype": args.dtype or "auto", "enable_prefix_caching": caching,
                              "tensor_parallel_size": args.tensor_parallel_size,
                              "trust_remote_code": args.trust_remote_code, **defaults}
    for name in PASSED_THROUGH:
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    if args.limit_mm_per_prompt:  # over the driver's defaults, modality by modality
        kwargs["limit_mm_per_prompt"] = {**kwargs.get("limit_mm_per_prompt", {}), **args.limit_mm_per_prompt}
    kwargs.update(args.extra)
    if stage.nice:  # the pacing executors apply it in the engine's process
        from vllm_omni.engine.backends.vllm.holding_scheduler import NICE_KEY

        kwargs["additional_config"] = {**kwargs.get("additional_config", {}), NICE_KEY: stage.nice}
    if cpu_platform():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return kwargs


def vllm_sampling(params: SamplingParams, stop_token_ids: list[int], json_schema: dict[str, Any] | None = None,
                  **overrides: Any) -> Any:
    """vLLM sampling parameters streaming deltas of token ids (no detokenisation); with
    `json_schema`, the output is constrained to JSON of that schema (structured outputs)."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    fields: dict[str, Any] = dict(
        temperature=params.temperature, top_k=params.top_k if params.top_k is not None else 0,
        top_p=params.top_p, min_p=params.min_p, max_tokens=params.max_tokens, min_tokens=params.min_tokens,
        repetition_penalty=params.repetition_penalty, seed=params.seed, ignore_eos=params.ignore_eos,
        stop_token_ids=stop_token_ids, detokenize=False, output_kind=RequestOutputKind.DELTA)
    if json_schema is not None:
        fields["structured_outputs"] = StructuredOutputsParams(json=json_schema)
    fields.update(overrides)
    return VllmSamplingParams(**fields)


class VllmEngineDriver:
    """One AsyncLLM engine serving one stage; subclasses say how it is configured
    (`engine_kwargs`) and how a request runs (`run`)."""

    def __init__(self, checkpoint_path: str, stage: StageConfig):
        self.checkpoint_path = checkpoint_path
        self.stage = stage
        self.engine: Any = None

    def engine_kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    def scheduling(self) -> tuple:
        """Arguments of `paced_engine_kwargs` after the platform: default, the holding scheduler."""
        return ()

    def forget(self, request_id: str) -> None:
        """Nothing kept outside a run by default."""

    async def forget_in_engine(self, request_id: str, feeder: asyncio.Task | None = None) -> None:
        """Free the request's state in the engine's processes (`omni_forget`), after stopping
        `feeder` (a task that sends the engine this request's inputs), so nothing of the
        request reaches the engine afterwards. The cleanup is not cancelled with the run (a
        drop may come while the run is ending) and its failure is logged, not raised over
        the run's own outcome."""
        cleanup = asyncio.ensure_future(self._forget_after(request_id, feeder))
        cleanup.add_done_callback(_log_failed_forget)
        await asyncio.wait([cleanup])

    async def _forget_after(self, request_id: str, feeder: asyncio.Task | None) -> None:
        if feeder is not None:
            feeder.cancel()
            await asyncio.wait([feeder])
        if self.engine is not None and not self.engine.errored:  # a dead engine holds nothing any more
            await self.engine.collective_rpc("omni_forget", args=(request_id,))

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from vllm_omni.engine.backends.vllm.holding_scheduler import paced_engine_kwargs

        kwargs = paced_engine_kwargs(self.engine_kwargs(), cpu_platform(), *self.scheduling())
        with stage_devices(self.stage):
            self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

    async def push_pace(self, snapshot: PaceSnapshot) -> None:
        """Hand the engine's scheduler the latest playback pacing (holding_scheduler.py)."""
        from vllm_omni.engine.backends.vllm.holding_scheduler import PACE_RPC

        if self.healthy():
            await self.engine.collective_rpc(PACE_RPC, args=snapshot.to_wire())

    async def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    def healthy(self) -> bool:
        return self.engine is not None and not self.engine.errored

    async def held_requests(self) -> int:
        """Requests the engine still holds: unfinished in vLLM, or with our state in its workers."""
        held = await self.engine.collective_rpc("omni_held_requests")
        return self.engine.get_num_unfinished_requests() + sum(held)


def _log_failed_forget(call: asyncio.Future) -> None:
    if not call.cancelled() and call.exception() is not None:
        logger.warning("omni_forget failed: %r", call.exception())
