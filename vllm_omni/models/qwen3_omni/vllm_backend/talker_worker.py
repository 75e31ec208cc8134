"""The talker engine's worker: a runner extension that tells the talker model, before each
forward, how the flattened batch is laid out (`TalkerStepPlan`), and the RPC methods the
orchestrator calls through `collective_rpc` (push text, take finished frames, forget).

The plan is built in `_model_forward` (the runner has updated its persistent batch and
prepared the inputs by then) from `input_batch.req_ids`, the scheduler's per-request
token counts, each request's computed-token count and the scheduled token ids; it is
cleared when `execute_model` returns, so vLLM's dummy and profiling runs see no plan.
A request whose prompt holds images brings its M-RoPE positions in its sampling params'
`extra_args`; `_init_mrope_positions` installs them.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_omni.config import SamplingParams
from vllm_omni.engine.backends.vllm.holding_scheduler import external_request_id
from vllm_omni.engine.backends.vllm.workers import RunnerExtensionWorkerMixin
from vllm_omni.models.qwen3_omni.vllm_backend.talker_feed import (
    IGNORE_EOS_KEY,
    MROPE_POSITIONS_KEY,
    REPETITION_PENALTY_KEY,
    ROPE_DELTA_KEY,
    TEXT_FEED,
)
from vllm_omni.models.qwen3_omni.vllm_backend.talker_model import PlannedRequest, TalkerStepPlan


def planned_sampling(params: Any) -> SamplingParams:
    """What the talker model needs of a request's vLLM sampling params."""
    extra = params.extra_args or {}
    return SamplingParams(temperature=params.temperature, seed=params.seed,
                          repetition_penalty=extra.get(REPETITION_PENALTY_KEY, 1.0),
                          ignore_eos=extra.get(IGNORE_EOS_KEY, False))


class _TalkerRunnerMixin:
    _omni_scheduled: Any = None

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self._omni_scheduled = scheduler_output
        try:
            return super().execute_model(scheduler_output, *args, **kwargs)
        finally:
            self._omni_scheduled = None
            self.get_model().plan = None

    def _init_mrope_positions(self, req_state: Any) -> None:
        """The prompt's positions as the orchestrator computed them, where it sent them."""
        extra = req_state.sampling_params.extra_args or {}
        if MROPE_POSITIONS_KEY not in extra:
            super()._init_mrope_positions(req_state)
            return
        req_state.mrope_positions = torch.tensor(extra[MROPE_POSITIONS_KEY], dtype=torch.int64)
        req_state.mrope_position_delta = extra[ROPE_DELTA_KEY]

    def _model_forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._omni_scheduled is not None:
            self.get_model().plan = self._omni_plan()
        return super()._model_forward(*args, **kwargs)

    def _omni_plan(self) -> TalkerStepPlan:
        scheduled = self._omni_scheduled
        total = scheduled.total_num_scheduled_tokens
        model = self.get_model()
        planned, start = [], 0
        for index, req_id in enumerate(self.input_batch.req_ids):
            count = scheduled.num_scheduled_tokens.get(req_id, 0)
            if count:
                request = self.requests[req_id]
                state = model.requests.get(req_id) or model.begin_request(
                    req_id, planned_sampling(request.sampling_params))  # once per request, not per step
                computed = int(self.input_batch.num_computed_tokens_cpu[index])  # rows before this step's
                planned.append(PlannedRequest(req_id, start, count, request.num_prompt_tokens, computed,
                                              state.sampling))
            start += count
        return TalkerStepPlan(planned, token_ids=self.input_ids.gpu[:total].cpu())


class TalkerWorkerMixin(RunnerExtensionWorkerMixin):
    runner_mixin = _TalkerRunnerMixin

    def _internal_ids(self, request_id: str) -> list[str]:
        return [key for key in self.model_runner.get_model().requests if external_request_id(key) == request_id]

    def omni_push_texts(self, pushes: list[list]) -> None:
        """[request id, token ids, finished] per request (rpc_pumps.TextPump)."""
        for request_id, token_ids, finished in pushes:
            TEXT_FEED.push(request_id, token_ids, finished)

    def omni_take_frames(self, request_ids: list[str]) -> dict[str, list[list[int]]]:
        """Finished frames (16 codes each) of these requests, in order; each frame once."""
        model = self.model_runner.get_model()
        wanted = set(request_ids)
        return {external_request_id(key): model.take_frames(key)
                for key in list(model.requests) if external_request_id(key) in wanted}

    def omni_forget(self, request_id: str) -> None:
        model = self.model_runner.get_model()
        for key in self._internal_ids(request_id):
            model.forget(key)
        TEXT_FEED.forget(request_id)

    def omni_held_requests(self) -> int:
        """Requests this worker keeps state or text for (0 once every request was forgotten)."""
        return len(self.model_runner.get_model().requests) + len(TEXT_FEED)
