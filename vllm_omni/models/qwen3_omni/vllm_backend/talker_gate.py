"""The talker engine's EngineCore side: a scheduler gate for streamed text (async_chunk),
and the executor that keeps the gate's copy of the text.

A talker decode step needs the thinker's next text row. Requests whose row has not
arrived yet sit out the step: they leave `running` for the duration of `schedule()` (and
count against `max_num_seqs`, so no new request takes their place) and come back at the
front, keeping their KV blocks. When nothing at all could run, the scheduler pauses 1 ms
instead of letting the engine loop spin. Selected with `scheduler_cls` (a class path).

The scheduler runs in the EngineCore process, the model in worker processes (vLLM's CPU
platform always uses the multiprocess executor). The text reaches both through
`collective_rpc`: `TalkerExecutor` (selected with `distributed_executor_backend`) files
pushed text and forgets in the EngineCore's own `TEXT_FEED`, then forwards the call to the
workers as usual.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.executor.multiproc_executor import MultiprocExecutor

from vllm_omni.models.qwen3_omni.vllm_backend.talker_feed import TEXT_FEED, external_request_id

IDLE_PAUSE_S = 0.001


class _TextGateMixin:
    running: list
    max_num_running_reqs: int

    def _text_ready(self, request) -> bool:
        step = request.num_computed_tokens - request.num_prompt_tokens
        return step < 0 or TEXT_FEED.ready(external_request_id(request.request_id), step)

    def schedule(self, *args, **kwargs):
        held = [request for request in self.running if not self._text_ready(request)]
        if not held:
            return super().schedule(*args, **kwargs)
        held_ids = {id(request) for request in held}
        self.running = [request for request in self.running if id(request) not in held_ids]
        self.max_num_running_reqs -= len(held)
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self.max_num_running_reqs += len(held)
            self.running = held + self.running
        if output.total_num_scheduled_tokens == 0:
            time.sleep(IDLE_PAUSE_S)
        return output


class TalkerScheduler(_TextGateMixin, Scheduler):
    pass


class TalkerAsyncScheduler(_TextGateMixin, AsyncScheduler):
    pass


class TalkerExecutor(MultiprocExecutor):
    def collective_rpc(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        call_args = kwargs.get("args", args[1] if len(args) > 1 else ())
        if method == "omni_push_text":
            TEXT_FEED.push(*call_args)
        elif method == "omni_forget":
            TEXT_FEED.forget(*call_args)
        return super().collective_rpc(method, *args, **kwargs)
