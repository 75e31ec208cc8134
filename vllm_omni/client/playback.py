"""What a listener hears of a streamed answer: a player that starts at the first audio chunk's
arrival and plays what it has queued at real time. Each chunk appends its duration to the
queue; when the queue runs dry before the next chunk arrives, the player stalls (silence) until
that chunk arrives, then plays on. Beside it, how late a player would have to start to never
stall (`start_delay_ms`), and how a player with a playout buffer fares (`buffered_stalls`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

STALL_TOLERANCE_MS = 1.0  # a queue short by less than this is clock noise, not a stall
PLAYOUT_BUFFERS_MS = (0, 60, 120)  # the playout buffers `stalls_at_buffer` reports


def start_delay_ms(chunks: Sequence[tuple[float, float]]) -> float | None:
    """The least delay D ≥ 0 after the first chunk's arrival at which a player can start and
    play at real time without ever running dry: chunk k is due at arrival_0 + D + (the
    durations before k), so D = max_k(arrival_k − arrival_0 − durations before k). A D within
    STALL_TOLERANCE_MS is clock noise: 0. None without chunks."""
    if not chunks:
        return None
    arrivals, durations = np.asarray(chunks, dtype=float).T
    played_before = np.cumsum(durations) - durations
    delay = float(np.max(arrivals - arrivals[0] - played_before))
    return delay if delay > STALL_TOLERANCE_MS else 0.0


def buffered_stalls(chunks: Sequence[tuple[float, float]], buffer_ms: float) -> tuple[int, float]:
    """(stalls, ms of stalled silence) for a player with a `buffer_ms` playout buffer: it waits
    until it holds `buffer_ms` of audio, or the last chunk has arrived (the answer ended),
    before it starts; when its queue runs dry (by more than STALL_TOLERANCE_MS) before the next
    chunk arrives, that is a stall, and it waits the same way again before playing on. The
    wait before the start is no stall (see `start_delay_ms`). `buffer_ms` 0 is the player of
    `playback_metrics`."""
    stalls, stalled_ms = 0, 0.0
    playing, dry_at, stalled_since, waiting_ms = False, 0.0, None, 0.0
    for index, (arrival, duration) in enumerate(chunks):
        if playing and dry_at < arrival - STALL_TOLERANCE_MS:
            stalls, stalled_since, playing, waiting_ms = stalls + 1, dry_at, False, 0.0
        if playing:
            dry_at = max(dry_at, arrival) + duration
            continue
        waiting_ms += duration
        if waiting_ms >= buffer_ms or index == len(chunks) - 1:
            if stalled_since is not None:
                stalled_ms += arrival - stalled_since
            playing, dry_at, stalled_since = True, arrival + waiting_ms, None
    return stalls, stalled_ms


def playback_metrics(chunks: Sequence[tuple[float, float]], ttfp_ms: float | None = None) -> dict[str, Any]:
    """`chunks`: (arrival ms, duration ms) of each audio chunk, in arrival order (any clock in
    ms); `ttfp_ms`: the first chunk's time to first audio. `stall_count`: how often the queue
    ran dry before a chunk arrived; `stall_ms`: the silence those stalls inserted;
    `min_buffer_ms`: the least audio queued ahead of the playhead when a chunk arrived (before
    it is queued), the first chunk left out: None with fewer than two chunks.
    `start_delay_ms`: `start_delay_ms(chunks)`; `playable_start_ms`: TTFP plus that delay,
    when a listener can start hearing the answer and never stall. `stalls_at_buffer` and
    `stall_ms_at_buffer`: `buffered_stalls` for each of PLAYOUT_BUFFERS_MS (keys: the ms as text)."""
    buffers, runs_dry_at = [], None  # when the queued audio will have played out
    for arrival, duration in chunks:
        if runs_dry_at is not None:
            buffers.append(max(runs_dry_at - arrival, 0.0))
        runs_dry_at = max(arrival if runs_dry_at is None else runs_dry_at, arrival) + duration
    at_buffer = {str(ms): buffered_stalls(chunks, ms) for ms in PLAYOUT_BUFFERS_MS}
    stall_count, stall_ms = at_buffer["0"]  # the player above (PLAYOUT_BUFFERS_MS starts at 0)
    delay = start_delay_ms(chunks)
    return {"stall_count": stall_count, "stall_ms": stall_ms,
            "min_buffer_ms": min(buffers) if buffers else None, "start_delay_ms": delay,
            "playable_start_ms": None if delay is None or ttfp_ms is None else ttfp_ms + delay,
            "stalls_at_buffer": {ms: stalls for ms, (stalls, _) in at_buffer.items()},
            "stall_ms_at_buffer": {ms: stalled for ms, (_, stalled) in at_buffer.items()}}
