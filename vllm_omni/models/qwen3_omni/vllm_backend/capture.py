"""Surfacing the thinker's layer-0 and accept-layer hidden states from vLLM's worker.

Extension point (vllm-integration.md §2.2, option A): vLLM's own Qwen3-Omni thinker
already implements `SupportsEagle3.set_aux_hidden_state_layers`, which makes its forward
return the inputs of chosen decoder layers next to the final hidden states. A custom
`worker_cls` (vllm_workers.py) swaps the model runner's class for a subclass that turns that on after the
model loads, takes the aux tensors off the forward's output (so the rest of vLLM sees the
ordinary output), and files the rows of each request's prompt positions under its request
id, using the batch layout (`input_batch.req_ids`, `num_scheduled_tokens`) and each
request's computed-token count from the scheduler output. No model code is copied and no
vLLM file is patched; the runner subclass works for the CPU and the GPU runner alike. Once a
request's prompt rows are complete (at the end of its last prefill step), the worker pushes
them to the driver if the request asked for them (row_channel.py), ahead of the step's
output, so they are there when the first token is.

Prefix caching: vLLM runs no forward for the positions [0, C) of a prompt whose first C
tokens it has cached (`num_computed_tokens` of the new request), so their rows come from
the worker's `PromptRowStore` (row_store.py), which keeps every finished prompt's rows by
content; rows it does not have are NaN, and the driver checks the ones the talker reads
(thinker.py). Only prompt positions are captured: the talker needs no row of a generated
token. The store holds as many rows as the KV cache has token slots, none when prefix
caching is off.

vLLM takes a layer's output after the deepstack visual features are added to it,
transformers before; the two agree when `accept_hidden_layer` lies past the layers that take
deepstack features, as in the real checkpoint (24 > 3) and the tiny one (tiny/config.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_omni.engine.backends.vllm.holding_scheduler import external_request_id
from vllm_omni.engine.backends.vllm.workers import RunnerExtensionWorkerMixin
from vllm_omni.models.qwen3_omni.vllm_backend.row_channel import ROW_ADDRESS_KEY, RowSender, reports_rows
from vllm_omni.models.qwen3_omni.vllm_backend.row_store import PromptKey, PromptRowStore


@dataclass
class PromptCapture:
    """One request's prompt rows [P, 2 (layer 0, accept layer), H] while its prefill runs."""

    key: PromptKey
    report: bool = False  # the request asked for its rows (row_channel.py)
    rows: torch.Tensor | None = None  # NaN until captured or found in the store
    filled: int = 0  # rows [0, filled) are set
    filed: bool = False  # complete and kept in the store

    def add(self, computed: int, step_rows: list[torch.Tensor], store: PromptRowStore) -> None:
        """This step's rows of the request (per layer [count, H], on the model's device), which
        start at position `computed`; positions vLLM skipped before it come from `store`."""
        length = len(self.key)
        if self.rows is None:
            hidden = step_rows[0]
            self.rows = torch.full((length, len(step_rows), hidden.shape[-1]), float("nan"), dtype=hidden.dtype)
        start = min(computed, length)
        if start > self.filled:  # cached by vLLM: skipped by the forward
            shared, kept = store.lookup(self.key, start)
            if shared > self.filled:
                self.rows[self.filled:shared] = kept[self.filled:]
        count = max(0, min(step_rows[0].shape[0], length - start))
        if count:
            self.rows[start:start + count] = torch.stack([r[:count] for r in step_rows], dim=1).cpu()
        self.filled = max(self.filled, start + count)
        if self.filled == length and not self.filed:
            store.file(self.key, self.rows)
            self.filed = True


class _CaptureRunnerMixin:
    _omni_captures: dict[str, PromptCapture]
    _omni_store: PromptRowStore | None
    _omni_last_aux: list[torch.Tensor] | None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        hf_config = self.model_config.hf_config
        accept_layer = hf_config.talker_config.accept_hidden_layer
        self.get_model().set_aux_hidden_state_layers((0, accept_layer))
        self._omni_captures, self._omni_store, self._omni_last_aux = {}, None, None

    def _model_forward(self, *args: Any, **kwargs: Any) -> Any:
        output = super()._model_forward(*args, **kwargs)
        if isinstance(output, tuple) and not self.use_aux_hidden_state_outputs:
            output, self._omni_last_aux = output
        return output

    def _omni_row_store(self) -> PromptRowStore:
        """Made on first use: the KV cache's size is known once the engine has run."""
        if self._omni_store is None:
            cache = self.cache_config
            slots = (cache.num_gpu_blocks or 0) * cache.block_size if cache.enable_prefix_caching else 0
            self._omni_store = PromptRowStore(slots)
        return self._omni_store

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self._omni_last_aux = None
        result = super().execute_model(scheduler_output, *args, **kwargs)
        if self._omni_last_aux is not None:
            self._omni_capture(scheduler_output, self._omni_last_aux)
            self._omni_last_aux = None
        return result

    def _omni_capture(self, scheduled: Any, aux: list[torch.Tensor]) -> None:
        new = {request.req_id: request for request in scheduled.scheduled_new_reqs}
        cached = scheduled.scheduled_cached_reqs
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        computed |= {req_id: request.num_computed_tokens for req_id, request in new.items()}
        offset = 0
        for req_id in self.input_batch.req_ids:
            count = scheduled.num_scheduled_tokens.get(req_id, 0)
            if req_id in new:
                request = new[req_id]
                self._omni_captures[req_id] = PromptCapture(PromptKey.of(request.prompt_token_ids,
                                                                         request.mm_features),
                                                            report=reports_rows(request.sampling_params))
            capture = self._omni_captures.get(req_id)  # None once taken or forgotten
            if count and capture is not None and not capture.filed:
                capture.add(computed[req_id], [layer[offset:offset + count] for layer in aux], self._omni_row_store())
            offset += count

    def omni_take_complete(self) -> dict[str, torch.Tensor]:
        """The rows [P, 2 (layer 0, accept layer), H] of every request whose prompt is complete
        and that asked for them, by the orchestrator's request id, NaN where neither the
        forward nor the store had them; complete requests are forgotten."""
        complete = [key for key, capture in self._omni_captures.items() if capture.filed]
        taken = {}
        for key in complete:
            capture = self._omni_captures.pop(key)
            if capture.report:
                taken[external_request_id(key)] = capture.rows
        return taken

    def omni_forget(self, request_prefix: str) -> None:
        for key in [k for k in self._omni_captures if external_request_id(k) == request_prefix]:
            del self._omni_captures[key]

    def omni_held_requests(self) -> int:
        return len(self._omni_captures)


class CaptureWorkerMixin(RunnerExtensionWorkerMixin):
    """The thinker engine's worker: the capturing runner and its RPC methods."""

    runner_mixin = _CaptureRunnerMixin
    _omni_rows: RowSender | None = None

    def execute_model(self, *args: Any, **kwargs: Any) -> Any:
        output = super().execute_model(*args, **kwargs)
        complete = self.model_runner.omni_take_complete()
        if complete and self.rank == 0:  # every tensor-parallel rank captures the same rows; one sends them
            if self._omni_rows is None:
                self._omni_rows = RowSender(self.vllm_config.additional_config[ROW_ADDRESS_KEY])
            for request_id, rows in complete.items():
                self._omni_rows.send(request_id, rows)
        return output

    def omni_forget(self, request_prefix: str) -> None:
        self.model_runner.omni_forget(request_prefix)

    def omni_held_requests(self) -> int:
        """Requests this worker keeps rows for (0 once every request was forgotten)."""
        return self.model_runner.omni_held_requests()
