"""Offline API: `Omni` (blocking, batches) and `AsyncOmni` (streaming) over the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vllm_omni.config import DeployConfig
from vllm_omni.engine import AudioChunk, OmniEngine, OmniRequest, RequestFinished
from vllm_omni.models.registry import load_engine

AsyncOmni = OmniEngine  # the streaming API is the engine interface itself


@dataclass
class OmniResult:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    audio: np.ndarray  # int16 PCM, mono
    sample_rate: int
    finished: RequestFinished


async def collect(engine: OmniEngine, request: OmniRequest) -> OmniResult:
    """Run one request to the end and gather its outputs."""
    chunks: list[bytes] = []
    sample_rate = 0
    async for output in engine.generate(request):
        if isinstance(output, AudioChunk):
            chunks.append(output.pcm16)
            sample_rate = output.sample_rate
        elif isinstance(output, RequestFinished):
            audio = np.frombuffer(b"".join(chunks), dtype="<i2").astype(np.int16)
            return OmniResult(request.request_id, output.text, output.token_ids, audio, sample_rate, output)
    raise RuntimeError(f"request {request.request_id} ended without a final output")


class Omni:
    """Blocking batch API: `Omni(model, deploy_config).generate([request, ...])`."""

    def __init__(self, model: str | Path, deploy_config: str | Path | DeployConfig,
                 code2wav_mode: str = "exact"):
        self.engine = load_engine(model, deploy_config, code2wav_mode=code2wav_mode)

    def generate(self, requests: OmniRequest | Sequence[OmniRequest]) -> list[OmniResult]:
        batch = [requests] if isinstance(requests, OmniRequest) else list(requests)

        async def run_all() -> list[OmniResult]:
            return list(await asyncio.gather(*(collect(self.engine, r) for r in batch)))

        return asyncio.run(run_all())

    def close(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
