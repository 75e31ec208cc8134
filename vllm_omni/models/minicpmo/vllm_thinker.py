"""MiniCPM-o's duplex loop (duplex_loop.py) with the LLM on a vLLM engine (docs/minicpmo.md,
"Stage 0 on vLLM"). Async: vLLM 0.32 resumes a request with new input only through
AsyncLLM's streaming input.

A session is one resumable vLLM request: its context lives in vLLM's KV cache from the first
unit to `close`, never re-prefilled. Each feed the loop wants a step after is one input chunk
of that request: its token ids, with one marker per run of embedding rows and the rows as
multimodal embeddings (vllm_model.py). The chunk asks vLLM for one token, which vLLM drops
when the next chunk arrives; what the loop decides by is the raw logits and hidden state at
the chunk's last position, which the engine's worker keeps for the request
(vllm_capture.py) and this driver takes once the chunk's output exists. So the project's unit
decoder samples in this process, on the same logits the torch backend computes, and vLLM's
sampler never chooses a token of the context. Feeds that want no step (the system turn, a
unit's terminator and `</unit>`) wait for the session's next chunk.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncGenerator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.protocol import StreamingInput
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM

from vllm_omni.engine.backends.vllm.engine_driver import cpu_platform
from vllm_omni.engine.backends.vllm.tensor_wire import tensor_from_wire
from vllm_omni.models.minicpmo.duplex_loop import (
    DEFAULT_SYSTEM_PROMPT,
    DuplexLoop,
    Feed,
    Rows,
    Run,
    SessionState,
    Step,
    Steps,
    UnitResult,
)
from vllm_omni.models.minicpmo.opening_settings import DEFAULT_WINDOW, ContextWindow
from vllm_omni.models.minicpmo.talker import TalkerSampling
from vllm_omni.models.minicpmo.unit_decoder import ScriptedDecision, UnitSampling
from vllm_omni.models.minicpmo.vllm_capture import worker_path
from vllm_omni.models.minicpmo.vllm_model import MARKERS, MAX_AUDIO_ROWS
from vllm_omni.models.vllm_plugin import MINICPMO_DUPLEX_THINKER

T = TypeVar("T")
_request_numbers = itertools.count()


def _request_id() -> str:
    return f"minicpmo-duplex-{next(_request_numbers)}"


@dataclass
class VllmDuplexSession(SessionState):
    """One conversation: the loop's state and its vLLM request."""

    request_id: str = field(default_factory=_request_id)  # a new one each time a window slides
    chunks: asyncio.Queue[Any] | None = None  # the request's input chunks; None ends the request
    outputs: AsyncGenerator[Any, None] | None = None
    pending: list[Run] = field(default_factory=list)  # fed, not sent yet: they go with the next chunk
    engine_context: int = 0  # the request's context length in vLLM, after its last chunk
    engine_forwarded: int = 0  # positions vLLM ran for it, all chunks together (= context: no re-prefill)


class VllmDuplexThinker(DuplexLoop):
    """`engine_args`: AsyncEngineArgs over the defaults below (float32, like the torch
    reference; prefix caching always off, as cached positions run no forward to capture)."""

    def __init__(self, path: str | Path, sampling: UnitSampling | None = None,
                 talker_sampling: TalkerSampling | None = None, compute: Executor | None = None, **engine_args: Any):
        """`compute`: where the loop's own torch work (encoders, talker) runs; None: on the event loop."""
        super().__init__(path, sampling, talker_sampling)
        self.compute = compute
        self.markers = {modality: self.tokenizer.convert_tokens_to_ids(marker) for modality, marker in MARKERS.items()}
        self.chunk_sampling = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False,
                                             output_kind=RequestOutputKind.DELTA)
        cpu = cpu_platform()
        if cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        kwargs = {"model": str(path), "dtype": "float32", "enable_mm_embeds": True,
                  # embeddings only: no tower profiling and no per-prompt count (a re-prefill after a
                  # window slide carries every kept unit's rows)
                  "limit_mm_per_prompt": {"audio": 0, "image": 0, "video": 0},
                  "hf_overrides": {"architectures": [MINICPMO_DUPLEX_THINKER]}, "worker_cls": worker_path(cpu),
                  **engine_args, "enable_prefix_caching": False}
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self.max_context = self.engine.model_config.max_model_len

    async def start(self, system_prompt: str = DEFAULT_SYSTEM_PROMPT, voice_rows: torch.Tensor | None = None,
                    generator: torch.Generator | None = None, user_text: str | None = None,
                    window: ContextWindow = DEFAULT_WINDOW) -> VllmDuplexSession:
        """A session whose context holds the system turn (with the voice prompt's rows, if any)
        and, with `user_text`, the user's opening turn; `window` bounds it."""
        if voice_rows is not None and voice_rows.shape[0] > MAX_AUDIO_ROWS:
            raise ValueError(f"a voice prompt of {voice_rows.shape[0]} rows; the engine takes at most {MAX_AUDIO_ROWS}")
        session = VllmDuplexSession(self.new_decoder(generator))
        await self._drive(session, self.start_steps(session, system_prompt, voice_rows, user_text, window))
        return session

    async def append_audio(self, session: VllmDuplexSession, samples: np.ndarray, *,
                           frames: list[bytes] | None = None, forced_listen: bool = False,
                           script: ScriptedDecision | None = None) -> list[UnitResult]:
        """Decide every unit these samples close (see `DuplexLoop.append_steps`)."""
        return await self._drive(session, self.append_steps(session, samples, frames, forced_listen, script))

    async def close(self, session: VllmDuplexSession) -> None:
        """End the session's request (vLLM frees its KV) and forget its captured step."""
        if session.outputs is not None:
            await session.chunks.put(None)
            async for _ in session.outputs:  # until vLLM has finished the request
                pass
            session.chunks = session.outputs = None
        await self.engine.collective_rpc("minicpmo_forget", args=(session.request_id,))

    def shutdown(self) -> None:
        self.engine.shutdown()

    async def _drive(self, session: VllmDuplexSession, steps: Steps[T]) -> T:
        loop = asyncio.get_running_loop()

        def advance(step: Step | None) -> tuple[bool, Any]:
            """(whether the steps are done, the next feed or their result)."""
            try:
                return False, steps.send(step)
            except StopIteration as done:
                return True, done.value

        done, value = await loop.run_in_executor(self.compute, advance, None)
        while not done:
            done, value = await loop.run_in_executor(self.compute, advance, await self._forward(session, value))
        return value

    async def _forward(self, session: VllmDuplexSession, feed: Feed) -> Step | None:
        if feed.restart:  # the window slid: a new request re-prefills the kept context with the next chunk
            await self.close(session)
            session.request_id, session.pending = _request_id(), []
        session.pending += feed.runs
        if not feed.wants_step:
            return None
        runs, session.pending = session.pending, []
        if session.outputs is None:
            session.chunks = asyncio.Queue()
            session.outputs = self.engine.generate(_until_none(session.chunks), self.chunk_sampling,
                                                   session.request_id)
        await session.chunks.put(StreamingInput(prompt=self._prompt(runs), sampling_params=self.chunk_sampling))
        await anext(session.outputs)
        step = (await self.engine.collective_rpc("minicpmo_take_step", args=(session.request_id,)))[0]
        expected = session.positions + feed.length  # the loop counts a feed once its step is back
        if step is None or step["context"] != expected:
            raise RuntimeError(f"session {session.request_id}: vLLM's context is "
                               f"{None if step is None else step['context']} positions, the loop's {expected}")
        session.engine_context, session.engine_forwarded = step["context"], step["forwarded"]
        return Step(tensor_from_wire(step["logits"]), tensor_from_wire(step["hidden"]))

    def _prompt(self, runs: list[Run]) -> TokensPrompt:
        """The chunk's token ids, a marker per run of rows, and the rows by modality."""
        ids: list[int] = []
        rows: dict[str, list[torch.Tensor]] = {}
        for run in runs:
            if isinstance(run, Rows):
                ids.append(self.markers[run.modality])
                rows.setdefault(run.modality, []).append(run.rows.detach().float().contiguous())
            else:
                ids += run
        return TokensPrompt(prompt_token_ids=ids, multi_modal_data=rows) if rows else TokensPrompt(
            prompt_token_ids=ids)


async def _until_none(queue: asyncio.Queue[Any]) -> AsyncGenerator[Any, None]:
    while (item := await queue.get()) is not None:
        yield item
