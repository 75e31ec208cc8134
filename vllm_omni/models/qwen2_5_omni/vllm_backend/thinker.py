"""Qwen2.5-Omni's thinker on vLLM: vLLM's own model class behind AsyncLLM, driven as
Qwen3-Omni's thinker is (qwen3_omni/vllm_backend/thinker.py: audio as precomputed log-mel
features, images decoded, prefix caching, the rows pushed by the capturing worker).

The talker reads the rows of the whole prompt and of every fed answer token (messages.py). The
prompt's come once the first token exists (`ThinkerPrompted`); answer token j's are computed in
the step that feeds it, which yields token j + 1, so each `ReplyRow` goes out ahead of the
token after it, as on the torch backend. With prefix caching, the worker keeps each finished
request's prompt and fed answer (capture.py), which is what the next turn's prompt repeats; a
row not kept is taken from an uncached prefill, as for Qwen3-Omni.
"""

from __future__ import annotations

import torch

from vllm_omni.engine.backends.vllm.engine_driver import cpu_platform
from vllm_omni.models.qwen2_5_omni.messages import ReplyRow, ThinkerPrompted
from vllm_omni.models.qwen2_5_omni.vllm_backend.workers import capture_worker_path
from vllm_omni.models.qwen3_omni.messages import ThinkerJob
from vllm_omni.models.qwen3_omni.vllm_backend.thinker import VllmThinkerDriver
from vllm_omni.models.vllm_plugin import QWEN2_5_OMNI_THINKER


class Qwen25VllmThinkerDriver(VllmThinkerDriver):
    architecture = QWEN2_5_OMNI_THINKER

    def special_ids(self) -> tuple[int, tuple[int, ...]]:
        thinker = self.checkpoint.config.thinker_config
        return self.checkpoint.im_end_id, (thinker.audio_token_index, thinker.image_token_index)

    def worker_cls(self) -> str:
        return capture_worker_path(cpu=cpu_platform())

    def rows_read(self, input_ids: list[int]) -> torch.Tensor:
        return torch.ones(len(input_ids), dtype=torch.bool)  # the talker reads every prompt row

    def prefill_report(self, job: ThinkerJob, first_token: int, rows: torch.Tensor) -> object:
        return ThinkerPrompted(job.prompt, rows[:, 0], first_token)

    async def rows_before(self, request_id: str, job: ThinkerJob, index: int) -> list[object]:
        if index == 0:
            return []
        rows = await self._take_rows(request_id, len(job.prompt.input_ids) + index - 1)
        return [ReplyRow(rows[0, 0])]
