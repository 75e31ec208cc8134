"""The tiny Qwen2.5-Omni deploy for tests: its engine, with each request's codes and the last
prompt kept for comparison."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.conftest import REPO
from vllm_omni.config import load_deploy_config
from vllm_omni.engine import OmniEngine
from vllm_omni.models.qwen2_5_omni.family import Qwen25OmniFamily
from vllm_omni.models.qwen3_omni.messages import CodecFrame

TINY_CONFIG = REPO / "configs" / "qwen2_5_omni_tiny_cpu_torch.yaml"
TINY_VLLM_CONFIG = REPO / "configs" / "qwen2_5_omni_tiny_cpu.yaml"  # the thinker on vLLM


class RecordingFamily(Qwen25OmniFamily):
    """The real family, also keeping each request's codes and the last rendered prompt."""

    codes: dict[str, list[int]]
    last_prompt = None

    def render(self, messages, audio_features, tools=(), call_tool=False, images=()):
        self.last_prompt = super().render(messages, audio_features, tools, call_tool, images)
        return self.last_prompt

    def route(self, state, role, event):
        if isinstance(event, CodecFrame):
            self.codes.setdefault(state.request_id, []).extend(event.codes)
        return super().route(state, role, event)

    def codes_of(self, request_id: str) -> np.ndarray:
        return np.array(self.codes.get(request_id, []), dtype=np.int64)


def make_engine(checkpoint, async_chunk: bool = True, first: int = 12, most: int = 48,
                config: Path = TINY_CONFIG) -> OmniEngine:
    """The tiny deploy with `async_chunk` and token2wav's first and largest windows (codes)."""
    deploy = load_deploy_config(config)
    connectors = [c.model_copy(update={"extra": c.extra.model_copy(update={
        "initial_codec_chunk_frames": first, "codec_chunk_frames": most})}) if c.extra else c
        for c in deploy.connectors]
    family = RecordingFamily.load(checkpoint, deploy.model_copy(update={"async_chunk": async_chunk,
                                                                        "connectors": connectors}))
    family.codes = {}
    return OmniEngine(family)

