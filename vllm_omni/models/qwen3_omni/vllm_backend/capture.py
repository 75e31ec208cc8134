"""Surfacing the thinker's layer-0 and accept-layer hidden states from vLLM's worker.

Extension point (vllm-integration.md §2.2, option A): vLLM's own Qwen3-Omni thinker
already implements `SupportsEagle3.set_aux_hidden_state_layers`, which makes its forward
return the inputs of chosen decoder layers next to the final hidden states. A custom
`worker_cls` (vllm_workers.py) swaps the model runner's class for a subclass that turns that on after the
model loads, takes the aux tensors off the forward's output (so the rest of vLLM sees the
ordinary output), and files the rows under their request ids using the batch layout
(`input_batch.req_ids`, `num_scheduled_tokens`). No model code is copied and no vLLM file
is patched; the runner subclass works for the CPU and the GPU runner alike. The rows stay
in the worker until the orchestrator takes them with `collective_rpc`
("omni_take_hidden_rows"), once the request's first token exists.

vLLM takes a layer's output after the deepstack visual features are added to it,
transformers before; the two agree when `accept_hidden_layer` lies past the layers that take
deepstack features, as in the real checkpoint (24 > 3) and the tiny one (tiny/config.py).
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_omni.engine.backends.vllm.tensor_wire import tensor_to_wire
from vllm_omni.engine.backends.vllm.workers import RunnerExtensionWorkerMixin


class _CaptureRunnerMixin:
    _omni_rows: dict[str, list[torch.Tensor]]
    _omni_last_aux: list[torch.Tensor] | None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        hf_config = self.model_config.hf_config
        accept_layer = hf_config.talker_config.accept_hidden_layer
        self.get_model().set_aux_hidden_state_layers((0, accept_layer))
        self._omni_rows, self._omni_last_aux = {}, None

    def _model_forward(self, *args: Any, **kwargs: Any) -> Any:
        output = super()._model_forward(*args, **kwargs)
        if isinstance(output, tuple) and not self.use_aux_hidden_state_outputs:
            output, self._omni_last_aux = output
        return output

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self._omni_last_aux = None
        result = super().execute_model(scheduler_output, *args, **kwargs)
        if self._omni_last_aux is not None:
            stacked = torch.stack([aux.detach().cpu() for aux in self._omni_last_aux], dim=1)  # [T, 2, H]
            offset = 0
            for req_id in self.input_batch.req_ids:
                count = scheduler_output.num_scheduled_tokens.get(req_id, 0)
                if count:
                    self._omni_rows.setdefault(req_id, []).append(stacked[offset:offset + count].clone())
                offset += count
        return result

    def omni_take_hidden_rows(self, request_prefix: str) -> dict[str, Any] | None:
        """Rows captured so far for the request whose internal id starts with `request_prefix`,
        [positions, 2 (layer 0, accept layer), hidden] in wire form (tensor_wire.py); forgets them."""
        key = next((k for k in self._omni_rows if k == request_prefix or k.startswith(request_prefix + "-")), None)
        if key is None:
            return None
        return tensor_to_wire(torch.cat(self._omni_rows.pop(key), dim=0))

    def omni_forget(self, request_prefix: str) -> None:
        for key in [k for k in self._omni_rows if k == request_prefix or k.startswith(request_prefix + "-")]:
            del self._omni_rows[key]

    def omni_held_requests(self) -> int:
        return len(self._omni_rows)


class CaptureWorkerMixin(RunnerExtensionWorkerMixin):
    """The thinker engine's worker: the capturing runner and its RPC methods."""

    runner_mixin = _CaptureRunnerMixin

    def omni_take_hidden_rows(self, request_prefix: str):
        return self.model_runner.omni_take_hidden_rows(request_prefix)

    def omni_forget(self, request_prefix: str) -> None:
        self.model_runner.omni_forget(request_prefix)

    def omni_held_requests(self) -> int:
        """Requests this worker keeps rows for (0 once every request was forgotten)."""
        return self.model_runner.omni_held_requests()
