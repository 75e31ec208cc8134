"""The talker engine's worker: a runner extension that tells the talker model, before each
forward, how the flattened batch is laid out (`TalkerStepPlan`) and, after the sampler, which
codebook-0 ids were sampled (the model completes their frames, which the worker pushes to
the driver at once: frame_channel.py), and the RPC methods the orchestrator calls through
`collective_rpc` (push text, forget).

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
from vllm_omni.models.qwen3_omni.vllm_backend.frame_channel import FRAME_ADDRESS_KEY, FrameSender, ends_request
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

    def sample_tokens(self, *args: Any, **kwargs: Any) -> Any:
        from vllm.v1.outputs import ModelRunnerOutput

        output = super().sample_tokens(*args, **kwargs)
        if not isinstance(output, ModelRunnerOutput):  # the talker runs synchronous scheduling only
            raise RuntimeError(f"talker: the sampler's output is a {type(output).__name__}, not a ModelRunnerOutput")
        model = self.get_model()
        sampled = []
        for request_id, token_ids in zip(output.req_ids, output.sampled_token_ids, strict=True):
            if token_ids and request_id in model.requests:  # none after a partial prefill chunk
                code0 = token_ids[-1]
                count = len(model.requests[request_id].codes0) + 1  # sampled ids, this one included
                max_tokens = self.requests[request_id].sampling_params.max_tokens
                sampled.append((request_id, code0, not ends_request(code0, count, model.eos_token_id, max_tokens)))
        model.complete_sampled(sampled)
        return output

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
    _omni_frames: FrameSender | None = None

    def sample_tokens(self, *args: Any, **kwargs: Any) -> Any:
        output = super().sample_tokens(*args, **kwargs)
        frames = self.model_runner.get_model().take_frames()
        if frames and self.rank == 0:  # every tensor-parallel rank completes the same frames; one sends them
            if self._omni_frames is None:
                self._omni_frames = FrameSender(self.vllm_config.additional_config[FRAME_ADDRESS_KEY])
            self._omni_frames.send({external_request_id(key): taken for key, taken in frames.items()})
        return output

    def _internal_ids(self, request_id: str) -> list[str]:
        return [key for key in self.model_runner.get_model().requests if external_request_id(key) == request_id]

    def omni_push_texts(self, pushes: list[list]) -> None:
        """[request id, token ids, finished] per request (rpc_pumps.TextPump)."""
        for request_id, token_ids, finished in pushes:
            TEXT_FEED.push(request_id, token_ids, finished)

    def omni_forget(self, request_id: str) -> None:
        model = self.model_runner.get_model()
        for key in self._internal_ids(request_id):
            model.forget(key)
        TEXT_FEED.forget(request_id)

    def omni_held_requests(self) -> int:
        """Requests this worker keeps state or text for (0 once every request was forgotten)."""
        return len(self.model_runner.get_model().requests) + len(TEXT_FEED)
