"""Building engines on the shared tiny checkpoint, and running requests to the end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from vllm_omni.config import get_deploy_config_path, load_deploy_config
from vllm_omni.engine import AudioChunk, OmniEngine, OmniRequest, RequestFinished, TextDelta
from vllm_omni.models.qwen3_omni.pipeline import Qwen3OmniPipeline
from vllm_omni.models.qwen3_omni.stages import CodecFrame


class RecordingPipeline(Qwen3OmniPipeline):
    """The real pipeline, also keeping each request's codec frames for comparison."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.frames: dict[str, list[tuple[int, ...]]] = {}

    def route(self, state, role, event):
        if isinstance(event, CodecFrame):
            self.frames.setdefault(state.request_id, []).append(event.codes)
        return super().route(state, role, event)

    def codes_of(self, request_id: str) -> np.ndarray:
        return np.array(self.frames.get(request_id, []), dtype=np.int64).reshape(-1, 16).T


def make_engine(checkpoint, *, async_chunk: bool = True, first: int = 4, later: int = 25,
                code2wav_mode: str = "exact", max_num_seqs: int | None = None,
                thinker_backend: str = "torch", talker_backend: str = "torch") -> OmniEngine:
    on_vllm = "vllm" in (thinker_backend, talker_backend)  # then with the served config's engine arguments
    config = "qwen3_omni_tiny_cpu" if on_vllm else "qwen3_omni_tiny_cpu_torch"
    deploy = load_deploy_config(get_deploy_config_path(config), platform="cpu")
    chunking = {"initial_codec_chunk_frames": first, "codec_chunk_frames": later}
    connectors = [c.model_copy(update={"extra": c.extra.model_copy(update=chunking)}) if c.extra else c
                  for c in deploy.connectors]
    backends = {"thinker": thinker_backend, "talker": talker_backend}
    stages = [s.model_copy(update={"backend": backends[s.role]}) if s.role in backends else s
              for s in deploy.stages]
    if max_num_seqs is not None:
        stages = [s.model_copy(update={"engine_args": s.engine_args.model_copy(
            update={"max_num_seqs": max_num_seqs})}) for s in stages]
    deploy = deploy.model_copy(update={"async_chunk": async_chunk, "connectors": connectors, "stages": stages})
    return OmniEngine(RecordingPipeline(checkpoint, deploy, code2wav_mode=code2wav_mode), deploy)


async def run_request(engine: OmniEngine, request: OmniRequest) -> dict[str, Any]:
    """Outputs of one request: text, PCM samples, chunks, codec ids, the final record."""
    text, chunks, final = "", [], None
    async for output in engine.generate(request):
        if isinstance(output, TextDelta):
            text += output.text
        elif isinstance(output, AudioChunk):
            chunks.append(output)
        elif isinstance(output, RequestFinished):
            final = output
    pcm = np.frombuffer(b"".join(c.pcm16 for c in chunks), dtype="<i2").astype(np.int32)
    return {"text": text, "final": final, "pcm": pcm, "chunks": chunks,
            "codes": engine.pipeline.codes_of(request.request_id)}


@contextmanager
def async_chunk_set_to(engine: OmniEngine, on: bool) -> Iterator[None]:
    """Requests started inside see `async_chunk` = `on` (the setting is read per request)."""
    saved = engine.pipeline.deploy.async_chunk
    engine.pipeline.set_async_chunk(on)
    try:
        yield
    finally:
        engine.pipeline.set_async_chunk(saved)
