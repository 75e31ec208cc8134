"""One batched step for every session with a frame due (docs/moshi.md, "Batching"): while a
step runs, the frames that come due queue, and the next step takes them all."""

from __future__ import annotations

import asyncio
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from vllm_omni.models.moshi.frame_loop import Frame, FrameLoop, StreamState


@dataclass
class _Due:
    state: StreamState
    frame: torch.Tensor
    forced: bool
    result: asyncio.Future[Frame]


class FrameBatcher:
    def __init__(self, loop: FrameLoop, compute: ThreadPoolExecutor):
        self.loop, self.compute = loop, compute
        self._due: list[_Due] = []
        self._runner: asyncio.Task | None = None
        self.batch_sizes: Counter[int] = Counter()  # steps run so far, by the number of frames in each

    async def step(self, state: StreamState, frame: torch.Tensor, forced: bool) -> Frame:
        """The model's frame for `state`'s user `frame` (a session has one frame due at a time)."""
        result: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._due.append(_Due(state, frame, forced, result))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="moshi-frames")
        return await result

    async def _run(self) -> None:
        while self._due:
            batch, self._due = self._due, []
            self.batch_sizes[len(batch)] += 1
            try:
                frames = await asyncio.get_running_loop().run_in_executor(
                    self.compute, self.loop.step, [d.state for d in batch], [d.frame for d in batch],
                    [d.forced for d in batch])
            except Exception as exc:  # each waiting session's append fails with it; the next step goes on
                for due in batch:
                    if not due.result.done():
                        due.result.set_exception(exc)
                continue
            for due, frame in zip(batch, frames, strict=True):
                if not due.result.done():
                    due.result.set_result(frame)
