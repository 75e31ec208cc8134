"""The talker on vLLM: our out-of-tree `Qwen3OmniTalkerForVllm` behind AsyncLLM.

Per request: the bridge builds the prompt rows from the thinker's hidden rows (as on the
torch backend) and the request goes in as `prompt_embeds`, with the rows' M-RoPE positions
when images make them non-sequential (the worker installs them, talker_worker.py). Text
the thinker feeds back arrives later (`feed`) and is pushed, in order, into the engine's
`TextFeed` by one pusher task per request (all requests' pushes ride one `collective_rpc`,
`TextPump`); the engine's scheduler holds a decode step
until its text row exists. Each engine output carries new codebook-0 ids; the frames they
complete (codes 1..15 from the code predictor, run right after the sampler) come from the
worker over a socket of their own (frame_channel.py), ahead of the output, and are emitted as
`CodecFrame`s. The last sampled id (EOS or the one reaching max_tokens) gets no frame, as in
the reference.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

from vllm_omni.config import StageConfig
from vllm_omni.engine.backends.vllm.engine_driver import VllmEngineDriver, cpu_platform, engine_kwargs, vllm_sampling
from vllm_omni.engine.stage_api import Emit, StageDone
from vllm_omni.models.qwen3_omni.checkpoint import Qwen3OmniCheckpoint
from vllm_omni.models.qwen3_omni.messages import CodecFrame, TalkerJob, ThinkerFinished, TrailingText
from vllm_omni.models.qwen3_omni.talker_bridge import ThinkerToTalkerBridge
from vllm_omni.models.qwen3_omni.vllm_backend.frame_channel import (
    FRAME_ADDRESS_KEY,
    FrameReceiver,
    ends_request,
    new_frame_address,
)
from vllm_omni.models.qwen3_omni.vllm_backend.rpc_pumps import TextPump
from vllm_omni.models.qwen3_omni.vllm_backend.talker_feed import (
    IGNORE_EOS_KEY,
    MROPE_POSITIONS_KEY,
    REPETITION_PENALTY_KEY,
    ROPE_DELTA_KEY,
)
from vllm_omni.models.qwen3_omni.vllm_backend.workers import worker_path
from vllm_omni.models.vllm_plugin import QWEN3_OMNI_TALKER

GATE = "vllm_omni.models.qwen3_omni.vllm_backend.talker_gate.{}"
_FINISHED = object()  # end marker in a request's text queue
FRAME_WAIT_S = 10.0  # a finished request's last frames left the worker before its output did


class VllmTalkerDriver(VllmEngineDriver):
    def __init__(self, checkpoint: Qwen3OmniCheckpoint, stage: StageConfig):
        super().__init__(str(checkpoint.path), stage)
        self.bridge = ThinkerToTalkerBridge(checkpoint)
        self.eos_token_id = checkpoint.config.talker_config.codec_eos_token_id
        self._text_queues: dict[str, asyncio.Queue] = {}
        self._frames = FrameReceiver(new_frame_address())
        self._text_pump: TextPump | None = None

    def engine_kwargs(self) -> dict[str, Any]:
        if self.stage.engine_args.enforce_eager is False:
            raise ValueError(f"stage {self.stage.stage_id} (talker) on vLLM: enforce_eager must be true (the "
                             "per-step code predictor and text rows run as Python around the decoder)")
        if self.stage.engine_args.extra.get("async_scheduling"):
            raise ValueError(f"stage {self.stage.stage_id} (talker) on vLLM: async_scheduling must be off (a "
                             "frame is completed from the sampler's output in the step that sampled it)")
        # Prefix caching: vLLM hashes a prompt-embeds block by its rows' bytes, so a later turn
        # reuses the KV of the earlier user turns where the bridge projects the same thinker rows
        # (capture.py) to the same bytes (it does on CPU; elsewhere a miss only costs the
        # prefill). The runner extension needs no prompt position's output but the last, which
        # always runs. Decode blocks are hashed by their codebook-0 ids, not their inputs (codec
        # sum + text row), but only a request resumed after preemption looks those up, and only
        # behind a byte-equal prompt.
        return engine_kwargs(
            self.stage, self.checkpoint_path, prefix_caching=True,
            hf_overrides={"architectures": [QWEN3_OMNI_TALKER]}, enable_prompt_embeds=True, skip_tokenizer_init=True,
            limit_mm_per_prompt={"audio": 0, "image": 0, "video": 0},
            enforce_eager=True, additional_config={FRAME_ADDRESS_KEY: self._frames.address},
            worker_cls=worker_path("Talker", cpu=cpu_platform()))

    def scheduling(self) -> tuple:
        """The text gate's scheduler and executor (talker_gate.py), which also pace;
        synchronous scheduling only (`engine_kwargs` refuses asynchronous)."""
        from vllm_omni.models.qwen3_omni.vllm_backend.talker_gate import TalkerExecutor, TalkerInProcessExecutor

        return (GATE.format("TalkerScheduler"),) * 2, (TalkerExecutor, TalkerInProcessExecutor), False

    def starts_request(self, message: object) -> bool:
        return isinstance(message, TalkerJob)

    async def start(self) -> None:
        self._frames.start()
        await super().start()
        self._text_pump = TextPump(self.engine)

    async def shutdown(self) -> None:
        if self._text_pump is not None:
            self._text_pump.close()
        self._text_pump = None
        self._frames.close()
        await super().shutdown()

    def _text_queue(self, request_id: str) -> asyncio.Queue:
        """The request's text queue; `feed` may come before `run` has started."""
        return self._text_queues.setdefault(request_id, asyncio.Queue())

    def forget(self, request_id: str) -> None:
        self._text_queues.pop(request_id, None)

    def feed(self, request_id: str, message: object) -> None:
        queue = self._text_queue(request_id)
        if isinstance(message, TrailingText):
            queue.put_nowait(message.token_ids)
        elif isinstance(message, ThinkerFinished):
            queue.put_nowait(_FINISHED)
        else:
            raise TypeError(f"talker cannot take {type(message).__name__}")

    async def _push_text(self, request_id: str, queue: asyncio.Queue) -> None:
        """Pushes queued text into the engine in order, coalescing what piled up meanwhile;
        once stopped, nothing of it is left on its way to the engine."""
        finished = False
        try:
            while not finished:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                token_ids = [t for item in items if item is not _FINISHED for t in item]
                finished = any(item is _FINISHED for item in items)
                await self._text_pump.push(request_id, token_ids, finished)
        finally:
            await self._text_pump.settle(request_id)

    async def run(self, request_id: str, message: object, emit: Emit) -> None:
        if not isinstance(message, TalkerJob):
            raise TypeError(f"talker cannot start with {type(message).__name__}")
        job, params = message, message.sampling
        extra: dict[str, Any] = {REPETITION_PENALTY_KEY: params.repetition_penalty, IGNORE_EOS_KEY: params.ignore_eos}
        if job.prompt.images:  # otherwise sequential, as the model's own `get_mrope_input_positions` gives them
            positions, delta = self.bridge.prompt_positions(job.prompt)
            extra |= {MROPE_POSITIONS_KEY: positions[1:, 0].tolist(), ROPE_DELTA_KEY: delta}
        sampling = vllm_sampling(
            params, [] if params.ignore_eos else [self.eos_token_id],
            repetition_penalty=1.0, ignore_eos=False,  # both applied by the model (vllm_talker_model.py)
            extra_args=extra)
        pusher = asyncio.create_task(self._push_text(request_id, self._text_queue(request_id)))
        frames_in = self._frames.open(request_id)
        codes0: list[int] = []
        frames = 0
        try:
            embeds = self.bridge.prompt_embeddings(job.prompt.input_ids, job.prefill, job.speaker)[0]
            prompt = {"prompt_embeds": embeds.contiguous()}
            # aclosing: however the loop ends, vLLM aborts the request before it is forgotten below
            async with aclosing(self.engine.generate(prompt, sampling, request_id)) as outputs:
                async for output in outputs:
                    codes0 += output.outputs[0].token_ids
                    if pusher.done():
                        pusher.result()  # surfaces a failed push
                    while not frames_in.empty():
                        frames += 1
                        emit(CodecFrame(tuple(frames_in.get_nowait())))
                    if output.finished:
                        ended = bool(codes0) and ends_request(codes0[-1], len(codes0), self.eos_token_id,
                                                              params.max_tokens)
                        for _ in range(len(codes0) - ended - frames):  # on their way still (seldom)
                            frames += 1
                            emit(CodecFrame(tuple(await asyncio.wait_for(frames_in.get(), FRAME_WAIT_S))))
                        emit(StageDone("stop" if codes0 and codes0[-1] == self.eos_token_id else "length", frames))
        finally:
            self._frames.close_request(request_id)
            await self.forget_in_engine(request_id, feeder=pusher)
