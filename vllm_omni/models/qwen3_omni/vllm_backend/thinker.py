"""The thinker on vLLM: vLLM's own Qwen3-Omni thinker model class behind AsyncLLM (with a fix
to its multimodal processor, thinker_model.py).

Audio goes through vLLM's multimodal path as precomputed log-mel features (computed
incrementally while the user spoke, audio/log_mel.py), which vLLM accepts with
`enable_mm_embeds` and expands to the same number of `<|audio_pad|>` positions as
transformers. Images go in decoded; vLLM runs the checkpoint's image processor on them and
expands each `<|image_pad|>` as the orchestrator did (images.py). The talker's prompt needs
the thinker's layer-0 and accept-layer rows of the prompt; the capturing worker (capture.py)
pushes them to this driver at the end of the request's prefill (row_channel.py), so they
are here when the first token is.

Prefix caching is on (unless the stage turns it off): each turn of a conversation prefills
only what the previous turns did not. The rows of cached positions come from the prompts the
worker kept (row_store.py), NaN where it kept none. Those of an earlier answer are never read;
should a row the talker reads be missing (its prompt was evicted, or was still in its
prefill when vLLM let this request share its blocks), the prompt is prefilled once more
beside it (one token, with a fresh `cache_salt`, which no cached block matches) for its rows;
the request's text streams on meanwhile. The first token is emitted before the rows are
taken: the text does not wait for them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import aclosing
from typing import Any, Protocol

import torch

from vllm_omni.config import StageConfig
from vllm_omni.engine.backends.vllm.engine_driver import VllmEngineDriver, cpu_platform, engine_kwargs, vllm_sampling
from vllm_omni.engine.stage_api import Emit, StageDone, TextToken
from vllm_omni.models.qwen3_omni.messages import ThinkerJob, ThinkerPrefill, ThinkerPrefilled
from vllm_omni.models.qwen3_omni.talker_bridge import user_positions
from vllm_omni.models.qwen3_omni.vllm_backend.row_channel import (
    REPORT_ROWS_KEY,
    ROW_ADDRESS_KEY,
    RowReceiver,
    new_row_address,
)
from vllm_omni.models.qwen3_omni.vllm_backend.workers import worker_path
from vllm_omni.models.vllm_plugin import QWEN3_OMNI_THINKER

logger = logging.getLogger(__name__)


UNCACHED_ROWS_SUFFIX = "-rows"  # the request id of a prompt's uncached prefill for its rows
ROWS_WAIT_S = 10.0  # the rows left the worker before the first token did; only a dead engine sends none


class RowsNotKept(RuntimeError):
    """A prompt row the talker reads came from vLLM's prefix cache without its worker keeping it."""


def collapse_placeholders(input_ids: list[int], placeholder_ids: tuple[int, ...]) -> list[int]:
    """One pad per audio or image item: vLLM's processor expands it from the item. Items of
    one modality never touch (each sits between its start and end tokens)."""
    collapsed: list[int] = []
    for token in input_ids:
        if not (token in placeholder_ids and collapsed and collapsed[-1] == token):
            collapsed.append(token)
    return collapsed


def rows_the_talker_reads(input_ids: list[int], im_start_id: int, user_id: int, assistant_id: int) -> torch.Tensor:
    """Positions [P] (bool) whose thinker rows the talker's prompt is built from
    (talker_bridge.py): the user segments and the last assistant segment."""
    ids = torch.tensor(input_ids)
    read = torch.zeros(len(input_ids), dtype=torch.bool)
    read[user_positions(ids, im_start_id, user_id)] = True
    starts = torch.nonzero((ids[:-1] == im_start_id) & (ids[1:] == assistant_id)).flatten()
    read[int(starts[-1]) if starts.numel() else 0:] = True
    return read


class ThinkerCheckpoint(Protocol):
    """What the driver reads of a family's checkpoint."""

    path: str
    config: Any
    talker: Any  # a torch module: the rows go to it in its dtype


class VllmThinkerDriver(VllmEngineDriver):
    architecture = QWEN3_OMNI_THINKER  # the model class vLLM serves (`hf_overrides`)

    def __init__(self, checkpoint: ThinkerCheckpoint, stage: StageConfig):
        super().__init__(checkpoint.path, stage)
        self.checkpoint = checkpoint
        self.eos_token_id, self.placeholder_ids = self.special_ids()
        self.row_receiver = RowReceiver(new_row_address())

    def special_ids(self) -> tuple[int, tuple[int, ...]]:
        """The answer's end, and the placeholder ids vLLM's processor expands (audio, image)."""
        config = self.checkpoint.config
        return config.im_end_token_id, (config.thinker_config.audio_token_id, config.thinker_config.image_token_id)

    def worker_cls(self) -> str:
        return worker_path("Capture", cpu=cpu_platform())

    def engine_kwargs(self) -> dict[str, Any]:
        # Audio and images: the stage's limits (vLLM's default when unset), which the
        # orchestrator keeps prompts within (engine/prompting.py); image: 0 reserves no memory
        # for the vision encoder. Video never comes from this pipeline: 0 unless configured.
        # Forced tool calls are compact JSON (xgrammar, no free whitespace between tokens, so a
        # call always ends).
        return engine_kwargs(self.stage, self.checkpoint_path, prefix_caching=True, enable_mm_embeds=True,
                             hf_overrides={"architectures": [self.architecture]},
                             limit_mm_per_prompt={"video": 0},
                             structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
                             additional_config={ROW_ADDRESS_KEY: self.row_receiver.address},
                             worker_cls=self.worker_cls())

    async def start(self) -> None:
        self.row_receiver.start()
        await super().start()

    async def shutdown(self) -> None:
        self.row_receiver.close()
        await super().shutdown()

    def starts_request(self, message: object) -> bool:
        return isinstance(message, ThinkerJob)

    def feed(self, request_id: str, message: object) -> None:
        raise TypeError(f"thinker takes no follow-up messages ({type(message).__name__})")

    def _prompt(self, job: ThinkerJob, cache_salt: str | None) -> Any:
        from vllm.inputs import TokensPrompt

        ids = collapse_placeholders(job.prompt.input_ids, self.placeholder_ids)
        data: dict[str, Any] = {}
        features = job.prompt.audio_features
        if features:
            # vLLM's layout (its field config splits the features by `audio_feature_lengths` along
            # time), so items of requests batched together in one encoder pass stay separable.
            data["audio"] = {"input_audio_features": torch.cat(list(features), dim=-1),
                             "audio_feature_lengths": torch.tensor([f.shape[-1] for f in features]),
                             "feature_attention_mask": [torch.ones(f.shape[-1], dtype=torch.long) for f in features]}
        if job.prompt.images:
            data["image"] = [image.image for image in job.prompt.images]
        prompt = TokensPrompt(prompt_token_ids=ids)
        if data:
            prompt["multi_modal_data"] = data
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        return prompt

    async def _take_rows(self, request_id: str, position: int = 0) -> torch.Tensor:
        """The rows the worker pushed for the request from `position` on (its mailbox was opened
        before the request reached the engine)."""
        try:
            rows = await self.row_receiver.open(request_id).take(position, ROWS_WAIT_S)
        except asyncio.TimeoutError:
            raise RuntimeError(f"no thinker rows were captured for request {request_id} "
                               f"(position {position})") from None
        return rows.to(self.checkpoint.talker.dtype)

    def rows_read(self, input_ids: list[int]) -> torch.Tensor:
        """The prompt positions [P] (bool) whose rows the talker reads."""
        config = self.checkpoint.config
        return rows_the_talker_reads(input_ids, config.im_start_token_id, config.user_token_id,
                                     config.assistant_token_id)

    def _checked_rows(self, request_id: str, captured: torch.Tensor, input_ids: list[int]) -> torch.Tensor:
        if captured.shape[0] != len(input_ids):
            raise RuntimeError(f"captured {captured.shape[0]} thinker rows for a {len(input_ids)}-token prompt")
        if captured[self.rows_read(input_ids)].isnan().any():
            raise RowsNotKept(f"thinker request {request_id}: rows of its cached prefix were not kept")
        return captured

    async def _uncached_rows(self, request_id: str, job: ThinkerJob) -> torch.Tensor:
        """The prompt's rows from a one-token prefill that no cached block matches."""
        rows_id = f"{request_id}{UNCACHED_ROWS_SUFFIX}"
        sampling = vllm_sampling(job.sampling, [self.eos_token_id], max_tokens=1, min_tokens=0,
                                 extra_args={REPORT_ROWS_KEY: True})
        self.row_receiver.open(rows_id)
        try:
            async with aclosing(self.engine.generate(self._prompt(job, uuid.uuid4().hex), sampling, rows_id)) as outs:
                async for _ in outs:
                    pass
            return self._checked_rows(rows_id, await self._take_rows(rows_id), job.prompt.input_ids)
        finally:
            self.row_receiver.close_request(rows_id)
            await self.forget_in_engine(rows_id)

    async def _prompt_rows(self, request_id: str, job: ThinkerJob) -> torch.Tensor:
        """The prompt's rows [P, layers, H], from the request's capture or, where a row the
        talker reads was not kept, from an uncached prefill."""
        input_ids = job.prompt.input_ids
        try:
            return self._checked_rows(request_id, await self._take_rows(request_id), input_ids)
        except RowsNotKept as missing:
            logger.info("%s; prefilling it again beside it without the prefix cache", missing)
            return await self._uncached_rows(request_id, job)

    def prefill_report(self, job: ThinkerJob, first_token: int, rows: torch.Tensor) -> object:
        """What the talker gets once the prompt is prefilled."""
        return ThinkerPrefilled(job.prompt, ThinkerPrefill(first_token=first_token, embeddings=rows[:, 0],
                                                           accept_hidden=rows[:, 1]))

    async def rows_before(self, request_id: str, job: ThinkerJob, index: int) -> list[object]:
        """What the talker gets ahead of answer token `index` (a family reading the answer's rows)."""
        return []

    async def run(self, request_id: str, message: object, emit: Emit) -> None:
        if not isinstance(message, ThinkerJob):
            raise TypeError(f"thinker cannot take {type(message).__name__}")
        if message.report_prefill:
            self.row_receiver.open(request_id)
        try:
            await self._generate(request_id, message, emit)
        finally:
            self.row_receiver.close_request(request_id)
            await self.forget_in_engine(request_id)

    async def _generate(self, request_id: str, job: ThinkerJob, emit: Emit) -> None:
        generated: list[int] = []
        sampling = vllm_sampling(job.sampling, [self.eos_token_id, *job.sampling.stop_token_ids],
                                 json_schema=job.json_schema,
                                 extra_args={REPORT_ROWS_KEY: True} if job.report_prefill else None)
        # aclosing: however the loop ends, vLLM aborts the request before it is forgotten
        async with aclosing(self.engine.generate(self._prompt(job, None), sampling, request_id)) as outputs:
            async for output in outputs:
                await self._on_output(request_id, job, output, generated, emit)

    async def _on_output(self, request_id: str, job: ThinkerJob, output: Any, generated: list[int],
                         emit: Emit) -> None:
        tokens = list(output.outputs[0].token_ids)
        for i, token in enumerate(tokens):
            last = output.finished and i == len(tokens) - 1
            index = len(generated)
            generated.append(token)
            if job.report_prefill:
                for event in await self.rows_before(request_id, job, index):
                    emit(event)
            emit(TextToken(token, fed=not last))
            if index == 0 and job.report_prefill and not last:
                emit(self.prefill_report(job, token, await self._prompt_rows(request_id, job)))
        if output.finished:
            emit(StageDone("length" if output.outputs[0].finish_reason == "length" else "stop", len(generated),
                           cached_prompt_tokens=output.num_cached_tokens or 0))
