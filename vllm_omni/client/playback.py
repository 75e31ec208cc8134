"""What a listener hears of a streamed answer: a player that starts at the first audio chunk's
arrival and plays what it has queued at real time. Each chunk appends its duration to the
queue; when the queue runs dry before the next chunk arrives, the player stalls (silence) until
that chunk arrives, then plays on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

STALL_TOLERANCE_MS = 1.0  # a queue short by less than this is clock noise, not a stall


def playback_metrics(chunks: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """`chunks`: (arrival ms, duration ms) of each audio chunk, in arrival order (any clock in
    ms). `stall_count`: how often the queue ran dry before a chunk arrived; `stall_ms`: the
    silence those stalls inserted; `min_buffer_ms`: the least audio queued ahead of the playhead
    when a chunk arrived (before it is queued), the first chunk left out: None with fewer than
    two chunks."""
    stall_count, stall_ms, buffers = 0, 0.0, []
    runs_dry_at: float | None = None  # when the queued audio will have played out
    for arrival, duration in chunks:
        if runs_dry_at is None:
            runs_dry_at = arrival  # playback starts
        else:
            queued = runs_dry_at - arrival
            buffers.append(max(queued, 0.0))
            if queued < -STALL_TOLERANCE_MS:
                stall_count += 1
                stall_ms -= queued
        runs_dry_at = max(runs_dry_at, arrival) + duration
    return {"stall_count": stall_count, "stall_ms": stall_ms, "min_buffer_ms": min(buffers) if buffers else None}
