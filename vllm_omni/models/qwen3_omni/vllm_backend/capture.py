"""Surfacing the thinker's hidden rows from vLLM's worker.

Extension point: a custom `worker_cls` (workers.py) swaps the model runner's class for a
subclass whose forward also yields, for every position it computes, the rows the family's
talker reads (`rows_of_forward`): for Qwen3-Omni the inputs of its layer 0 and of its accept
layer, which vLLM's own thinker returns once `SupportsEagle3.set_aux_hidden_state_layers` turns
them on (taken off the forward's output, so the rest of vLLM sees the ordinary output);
Qwen2.5-Omni's are built in its own module (models/qwen2_5_omni/vllm_backend/capture.py). The
runner files the rows under each request's id, using the batch layout (`input_batch.req_ids`,
`num_scheduled_tokens`) and each request's computed-token count from the scheduler output. No
model code is copied and no vLLM file is patched; the runner subclass works for the CPU and the
GPU runner alike. Once a request's prompt rows are complete (at the end of its last prefill
step), the worker pushes them to the driver if the request asked for them (row_channel.py),
ahead of the step's output, so they are there when the first token is. A family whose talker
also reads the answer (`follows_answer`) gets the row of each fed answer token pushed at the
end of its step.

Prefix caching: vLLM runs no forward for the positions [0, C) of a prompt whose first C tokens
it has cached (`num_computed_tokens` of the new request), so their rows come from the worker's
`PromptRowStore` (row_store.py), which keeps every finished prompt's rows by content (with
`follows_answer`, the prompt and its fed answer, filed when the request is forgotten); rows it
does not have are NaN, and the driver checks the ones the talker reads (thinker.py). The store
holds as many rows as the KV cache has token slots, none when prefix caching is off.

vLLM takes a layer's output after the deepstack visual features are added to it, transformers
before; the two agree when `accept_hidden_layer` lies past the layers that take deepstack
features, as in the real checkpoint (24 > 3) and the tiny one (tiny/config.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_omni.engine.backends.vllm.holding_scheduler import external_request_id
from vllm_omni.engine.backends.vllm.workers import RunnerExtensionWorkerMixin
from vllm_omni.models.qwen3_omni.vllm_backend.row_channel import ROW_ADDRESS_KEY, RowSender, reports_rows
from vllm_omni.models.qwen3_omni.vllm_backend.row_store import PromptKey, PromptRowStore

Outgoing = tuple[str, int, torch.Tensor]  # (request id, first position, rows [n, layers, H])


@dataclass
class RowCapture:
    """One request's rows [.., layers, H]: its prompt's while its prefill runs and, when it
    `follows` the answer, each fed answer token's (in position order, once each: a preempted
    request's recomputed positions are not taken twice)."""

    key: PromptKey
    report: bool = False  # the request asked for its rows (row_channel.py)
    follows: bool = False
    rows: torch.Tensor | None = None  # [P, layers, H], NaN until captured or found in the store
    filled: int = 0  # rows [0, filled) are set
    filed: bool = False  # complete and kept in the store
    prompt_sent: bool = False
    answer_rows: list[torch.Tensor] = field(default_factory=list)  # [layers, H] per fed answer token
    answer_ids: list[int] = field(default_factory=list)
    outbox: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # answer rows not yet sent

    def add(self, computed: int, step_rows: torch.Tensor, store: PromptRowStore,
            step_ids: torch.Tensor | None = None) -> None:
        """This step's rows of the request ([count, layers, H], on the model's device) and, when
        following the answer, their token ids; they start at position `computed`, and positions
        vLLM skipped before it come from `store`."""
        length = len(self.key)
        if self.rows is None:
            self.rows = torch.full((length, *step_rows.shape[1:]), float("nan"), dtype=step_rows.dtype)
        start = min(computed, length)
        if start > self.filled:  # cached by vLLM: skipped by the forward
            shared, kept = store.lookup(self.key, start)
            if shared > self.filled:
                self.rows[self.filled:shared] = kept[self.filled:]
        count = max(0, min(step_rows.shape[0], length - start))
        if count:
            self.rows[start:start + count] = step_rows[:count].cpu()
        self.filled = max(self.filled, start + count)
        if self.filled == length and not self.filed:
            store.file(self.key, self.rows)
            self.filed = True
        if self.follows and step_ids is not None:
            self._add_answer(computed, step_rows, step_ids)

    def _add_answer(self, computed: int, step_rows: torch.Tensor, step_ids: torch.Tensor) -> None:
        skip = len(self.key) + len(self.answer_rows) - computed  # positions already taken (or in the prompt)
        if skip < 0 or skip >= step_rows.shape[0]:
            return
        new = step_rows[skip:].cpu()
        self.answer_rows.extend(new)
        self.answer_ids.extend(step_ids[skip:].tolist())
        if self.report:
            self.outbox.append((computed + skip, new))

    def take_outgoing(self) -> list[tuple[int, torch.Tensor]]:
        """What to push to the driver now: the complete prompt's rows once, then the answer's."""
        out: list[tuple[int, torch.Tensor]] = []
        if self.filed and self.report and not self.prompt_sent:
            self.prompt_sent = True
            out.append((0, self.rows))
        out.extend(self.outbox)
        self.outbox.clear()
        return out

    def file_answer(self, store: PromptRowStore) -> None:
        """Keep the prompt and its fed answer as one sequence: a later turn's prompt repeats them."""
        if self.filed and self.answer_rows:
            store.file(self.key.extended(self.answer_ids), torch.cat([self.rows, torch.stack(self.answer_rows)]))


class CaptureRunnerMixin:
    """The capturing model runner; a family says which rows its forward yields."""

    follows_answer = False  # the talker also reads each fed answer token's rows
    _omni_captures: dict[str, RowCapture]
    _omni_store: PromptRowStore | None
    _omni_step: tuple[torch.Tensor, torch.Tensor | None] | None  # this step's rows and token ids

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        self.enable_rows()
        self._omni_captures, self._omni_store, self._omni_step = {}, None, None

    def enable_rows(self) -> None:
        """Set the loaded model up to yield its rows."""

    def rows_of_forward(self, output: Any, ids: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        """(the forward's output as vLLM expects it, the rows [tokens, layers, H] of the step's
        tokens `ids`, or None)."""
        raise NotImplementedError

    def _model_forward(self, *args: Any, **kwargs: Any) -> Any:
        output = super()._model_forward(*args, **kwargs)
        ids = kwargs.get("input_ids")
        if ids is None:  # vLLM feeds a multimodal model embeddings: the ids stay in its buffer
            ids = self.input_ids.gpu[:kwargs["positions"].shape[-1]]
        output, rows = self.rows_of_forward(output, ids)
        if rows is not None:
            self._omni_step = rows, ids if self.follows_answer else None
        return output

    def _omni_row_store(self) -> PromptRowStore:
        """Made on first use: the KV cache's size is known once the engine has run."""
        if self._omni_store is None:
            cache = self.cache_config
            slots = (cache.num_gpu_blocks or 0) * cache.block_size if cache.enable_prefix_caching else 0
            self._omni_store = PromptRowStore(slots)
        return self._omni_store

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self._omni_step = None
        result = super().execute_model(scheduler_output, *args, **kwargs)
        if self._omni_step is not None:
            self._omni_capture(scheduler_output, *self._omni_step)
            self._omni_step = None
        return result

    def _omni_capture(self, scheduled: Any, rows: torch.Tensor, ids: torch.Tensor | None) -> None:
        new = {request.req_id: request for request in scheduled.scheduled_new_reqs}
        cached = scheduled.scheduled_cached_reqs
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        computed |= {req_id: request.num_computed_tokens for req_id, request in new.items()}
        ids = ids.cpu() if ids is not None else None
        offset = 0
        for req_id in self.input_batch.req_ids:
            count = scheduled.num_scheduled_tokens.get(req_id, 0)
            if req_id in new:
                request = new[req_id]
                self._omni_captures[req_id] = RowCapture(PromptKey.of(request.prompt_token_ids, request.mm_features),
                                                         report=reports_rows(request.sampling_params),
                                                         follows=self.follows_answer)
            capture = self._omni_captures.get(req_id)  # None once taken or forgotten
            if count and capture is not None and (capture.follows or not capture.filed):
                capture.add(computed[req_id], rows[offset:offset + count], self._omni_row_store(),
                            ids[offset:offset + count] if ids is not None else None)
            offset += count

    def omni_take_outgoing(self) -> list[Outgoing]:
        """The rows to push now, by the orchestrator's request id (NaN where neither the forward
        nor the store had them); a capture that follows no answer is forgotten once complete."""
        out: list[Outgoing] = []
        for key, capture in list(self._omni_captures.items()):
            out.extend((external_request_id(key), position, rows) for position, rows in capture.take_outgoing())
            if capture.filed and not capture.follows:
                del self._omni_captures[key]
        return out

    def omni_forget(self, request_prefix: str) -> None:
        for key in [k for k in self._omni_captures if external_request_id(k) == request_prefix]:
            self._omni_captures.pop(key).file_answer(self._omni_row_store())

    def omni_held_requests(self) -> int:
        return len(self._omni_captures)


class _Qwen3CaptureRunnerMixin(CaptureRunnerMixin):
    """Qwen3-Omni's rows: the inputs of layer 0 and of the talker's accept layer."""

    def enable_rows(self) -> None:
        accept_layer = self.model_config.hf_config.talker_config.accept_hidden_layer
        self.get_model().set_aux_hidden_state_layers((0, accept_layer))

    def rows_of_forward(self, output: Any, ids: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        if isinstance(output, tuple) and not self.use_aux_hidden_state_outputs:
            output, aux = output
            return output, torch.stack(aux, dim=1)
        return output, None


class CaptureWorkerMixin(RunnerExtensionWorkerMixin):
    """The thinker engine's worker: the capturing runner and its RPC methods."""

    runner_mixin: type = _Qwen3CaptureRunnerMixin
    _omni_rows: RowSender | None = None

    def execute_model(self, *args: Any, **kwargs: Any) -> Any:
        output = super().execute_model(*args, **kwargs)
        outgoing = self.model_runner.omni_take_outgoing()
        if outgoing and self.rank == 0:  # every tensor-parallel rank captures the same rows; one sends them
            if self._omni_rows is None:
                self._omni_rows = RowSender(self.vllm_config.additional_config[ROW_ADDRESS_KEY])
            for request_id, position, rows in outgoing:
                self._omni_rows.send(request_id, rows, position)
        return output

    def omni_forget(self, request_prefix: str) -> None:
        self.model_runner.omni_forget(request_prefix)

    def omni_held_requests(self) -> int:
        """Requests this worker keeps rows for (0 once every request was forgotten)."""
        return self.model_runner.omni_held_requests()
