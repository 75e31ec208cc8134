"""`vllm-omni bench realtime --endpoint chat`: the realtime bench's load over HTTP. Each
session is one conversation of streamed `POST /v1/chat/completions` requests (client/chat.py),
the question sent whole as a WAV; its rows have the realtime bench's shape, so its table, JSON
and plot (bench/realtime.py) serve both. An HTTP error ends its session (`failed_sessions`);
the client cannot check decoded audio against a server-side duration (`lost_audio_turns` 0)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm_omni.bench.realtime import level_row, level_runner, staggered, timed_gather, turn_rows
from vllm_omni.bench.report import run_levels
from vllm_omni.client.chat import ChatTurn, run_chat


async def run_level(base_url: str, pcm: bytes, sessions: int, turns: int, *, model: str | None = None,
                    arrival_spread_s: float = 0.0,
                    on_turn: Callable[[ChatTurn], None] | None = None) -> dict[str, Any]:
    """`sessions` concurrent conversations of `turns` questions each, started evenly over
    `arrival_spread_s` seconds; `on_turn` is called with each answer as it ends. An answer's
    status is its `finish_reason`."""
    outcomes, wall_s = await timed_gather(staggered(
        [run_chat(base_url, pcm, turns=turns, model=model, on_turn=on_turn) for _ in range(sessions)],
        arrival_spread_s))
    conversations = [outcome if isinstance(outcome, list) else [] for outcome in outcomes]
    per_turn = turn_rows([[(turn.metrics, turn.finish_reason) for turn in answers] for answers in conversations])
    return level_row(sessions, turns, wall_s, per_turn,
                     completed=sum(1 for row in per_turn if row["status"] is not None),
                     failures=[outcome for outcome in outcomes if isinstance(outcome, BaseException)])


def run_benchmark(targets: dict[str, str], levels: Sequence[int], pcm: bytes, turns: int, *,
                  model: str | None = None, arrival_spread_s: float = 0.0) -> dict[str, list[dict[str, Any]]]:
    """For each target (name → `chat_base_url`), each concurrency level in turn."""
    return {name: run_levels(name, levels, level_runner(run_level, base_url, pcm, turns, model=model,
                                                        arrival_spread_s=arrival_spread_s),
                             answers_per_session=turns) for name, base_url in targets.items()}
