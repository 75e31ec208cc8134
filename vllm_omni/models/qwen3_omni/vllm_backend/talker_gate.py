"""The talker engine's EngineCore side: a scheduler gate for streamed text (async_chunk),
and the executor that keeps the gate's copy of the text.

A talker decode step needs the thinker's next text row. Requests whose row has not
arrived yet sit out the step, as answers that playback pacing lets yield do
(engine/backends/vllm/holding_scheduler.py). Selected with `scheduler_cls` (a class path).

The text reaches both the scheduler and the model through `collective_rpc`. With the model
in worker processes, `TalkerExecutor` (selected with `distributed_executor_backend`) files
pushed text and forgets in the EngineCore's own `TEXT_FEED`, then forwards the call to the
workers as usual; with the model in the EngineCore's process (`TalkerInProcessExecutor`,
one device) the model's call fills the one `TEXT_FEED` both read.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from vllm_omni.engine.backends.vllm.holding_scheduler import (
    PacedExecutor,
    PacedInProcessExecutor,
    _HoldingMixin,
    external_request_id,
    rpc_args,
)
from vllm_omni.models.qwen3_omni.vllm_backend.talker_feed import TEXT_FEED


class _TextGateMixin(_HoldingMixin):
    def _text_ready(self, request) -> bool:
        step = request.num_computed_tokens - request.num_prompt_tokens
        return step < 0 or TEXT_FEED.ready(external_request_id(request.request_id), step)

    def _held(self, running: list) -> list:
        paced = {id(request) for request in super()._held(running)}
        return [r for r in running if id(r) in paced or not self._text_ready(r)]


class TalkerScheduler(_TextGateMixin, Scheduler):
    pass


class TalkerExecutor(PacedExecutor):
    def collective_rpc(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        if method == "omni_push_texts":
            for request_id, token_ids, finished in rpc_args(args, kwargs)[0]:
                TEXT_FEED.push(request_id, token_ids, finished)
        elif method == "omni_forget":
            TEXT_FEED.forget(*rpc_args(args, kwargs))
        return super().collective_rpc(method, *args, **kwargs)


class TalkerInProcessExecutor(PacedInProcessExecutor):
    """The model shares the EngineCore's process and so its `TEXT_FEED`: the workers' copy
    is the gate's, filled once by the call the model answers."""
