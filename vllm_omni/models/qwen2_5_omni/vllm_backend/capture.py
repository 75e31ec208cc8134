"""Qwen2.5-Omni's thinker rows from vLLM's worker (the capture itself: qwen3_omni/vllm_backend/capture.py).

The talker reads, at every position of the prompt and of the answer, the thinker's last hidden
state (after the final norm: what the model's forward returns) plus the position's input
embedding, zero at audio, image and video positions (messages.py). Both come from the runner's
forward; the embedding is looked up again from the step's token ids, since vLLM hands a
multimodal model its embeddings with the media rows already merged in.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_omni.models.qwen3_omni.vllm_backend.capture import CaptureRunnerMixin, CaptureWorkerMixin


class _ReplyCaptureRunnerMixin(CaptureRunnerMixin):
    follows_answer = True
    _omni_media_ids: torch.Tensor

    def enable_rows(self) -> None:
        thinker = self.model_config.hf_config.thinker_config
        self._omni_media_ids = torch.tensor([thinker.audio_token_index, thinker.image_token_index,
                                             thinker.video_token_index])

    def rows_of_forward(self, output: Any, ids: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        if not isinstance(output, torch.Tensor):  # an intermediate pipeline stage's tensors
            return output, None
        embeddings = self.get_model().embed_input_ids(ids)
        embeddings[torch.isin(ids, self._omni_media_ids.to(ids.device))] = 0
        return output, (output + embeddings).unsqueeze(1)


class ReplyCaptureWorkerMixin(CaptureWorkerMixin):
    runner_mixin = _ReplyCaptureRunnerMixin
