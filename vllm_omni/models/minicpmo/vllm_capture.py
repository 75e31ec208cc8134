"""What the duplex loop needs from each vLLM step: the raw logits and the last-layer hidden state
at a request's last scheduled position (docs/minicpmo.md, "Stage 0 on vLLM").

The project's unit decoder samples from raw logits (its repetition penalty acts on them), and
the talker needs the hidden state of every fed token, so neither can come from vLLM's sampler
output. A custom `worker_cls` (as for Qwen3-Omni, engine/backends/vllm/workers.py) turns the
model runner into a subclass that, after each forward, reads the logits and the hidden
states they were computed from (the runner's `execute_model_state`, rows in
`input_batch.req_ids` order) and keeps each request's latest row, plus how many positions
the request has forwarded in all and its context length, which tell a re-prefill from a
growing context. The driver takes them with `collective_rpc("minicpmo_take_step")` once the
chunk's output exists; the rows stay in the worker until then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_omni.engine.backends.vllm.tensor_wire import tensor_to_wire
from vllm_omni.engine.backends.vllm.workers import RunnerExtensionWorkerMixin, worker_class_path, worker_namespace


@dataclass
class _RequestSteps:
    logits: torch.Tensor | None = None  # [vocab] at the last scheduled position
    hidden: torch.Tensor | None = None  # [hidden], the row the LM head read
    forwarded: int = 0  # positions run through the model, all steps together
    context: int = 0  # the request's computed positions after its last step


def _matching(keys: Any, request_prefix: str) -> list[str]:
    """Internal ids of the request (vLLM appends "-<suffix>" to the caller's id)."""
    return [key for key in keys if key == request_prefix or key.startswith(request_prefix + "-")]


class _StepCaptureRunnerMixin:
    _duplex_steps: dict[str, _RequestSteps]

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        self._duplex_steps = {}

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().execute_model(scheduler_output, *args, **kwargs)
        state = self.execute_model_state
        if state is not None and state.logits is not None:
            for row, req_id in enumerate(self.input_batch.req_ids):
                count = scheduler_output.num_scheduled_tokens.get(req_id, 0)
                if not count:
                    continue
                request = self.requests[req_id]
                entry = self._duplex_steps.setdefault(req_id, _RequestSteps())
                entry.forwarded += count
                entry.context = request.num_computed_tokens + count
                if entry.context == request.num_tokens:  # not a partial prefill: its last position is the chunk's
                    entry.logits = state.logits[row].detach().to("cpu", torch.float32, copy=True)
                    entry.hidden = state.sample_hidden_states[row].detach().to("cpu", torch.float32, copy=True)
        return result

    def minicpmo_take_step(self, request_prefix: str) -> dict[str, Any] | None:
        """The request's latest logits and hidden row (wire form, tensor_wire.py) with its counts."""
        keys = _matching(self._duplex_steps, request_prefix)
        if not keys:
            return None
        entry = self._duplex_steps[keys[0]]
        if entry.logits is None:
            return None
        return {"logits": tensor_to_wire(entry.logits), "hidden": tensor_to_wire(entry.hidden),
                "forwarded": entry.forwarded, "context": entry.context}

    def minicpmo_forget(self, request_prefix: str) -> None:
        for key in _matching(self._duplex_steps, request_prefix):
            del self._duplex_steps[key]


class StepCaptureWorkerMixin(RunnerExtensionWorkerMixin):
    """The duplex thinker engine's worker: the capturing runner and its RPC methods."""

    runner_mixin = _StepCaptureRunnerMixin

    def minicpmo_take_step(self, request_prefix: str) -> dict[str, Any] | None:
        return self.model_runner.minicpmo_take_step(request_prefix)

    def minicpmo_forget(self, request_prefix: str) -> None:
        self.model_runner.minicpmo_forget(request_prefix)


__getattr__ = worker_namespace(__name__, {"StepCapture": f"{__name__}:StepCaptureWorkerMixin"})


def worker_path(cpu: bool) -> str:
    """`worker_cls` for the duplex thinker engine on this platform."""
    return worker_class_path(__name__, "StepCapture", cpu)
