"""`vllm-omni bench realtime --endpoint chat`: the realtime bench's load over HTTP. Each
session is one conversation of streamed `POST /v1/chat/completions` requests (client/chat.py),
the question sent whole as a WAV; its rows have the realtime bench's shape, so its table, JSON
and plot (bench/realtime.py) serve both. An HTTP error ends its session (`failed_sessions`);
the client cannot check decoded audio against a server-side duration (`lost_audio_turns` 0)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from vllm_omni.bench.realtime import level_row, timed_gather
from vllm_omni.bench.report import run_levels
from vllm_omni.client.chat import run_chat


async def run_level(base_url: str, pcm: bytes, sessions: int, turns: int, *,
                    model: str | None = None) -> dict[str, Any]:
    """`sessions` concurrent conversations of `turns` questions each."""
    outcomes, wall_s = await timed_gather([run_chat(base_url, pcm, turns=turns, model=model)
                                           for _ in range(sessions)])
    answers = [turn for outcome in outcomes if isinstance(outcome, list) for turn in outcome]
    return level_row(sessions, turns, wall_s, [turn.metrics for turn in answers],
                     completed=sum(1 for turn in answers if turn.finish_reason is not None),
                     failures=[outcome for outcome in outcomes if isinstance(outcome, BaseException)])


def run_benchmark(targets: dict[str, str], levels: Sequence[int], pcm: bytes, turns: int, *,
                  model: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """For each target (name → `chat_base_url`), each concurrency level in turn."""
    return {name: run_levels(name, levels, lambda sessions, base_url=base_url: asyncio.run(
        run_level(base_url, pcm, sessions, turns, model=model))) for name, base_url in targets.items()}
