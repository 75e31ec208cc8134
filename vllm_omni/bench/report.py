"""What every benchmark writes: its settings and results as JSON, and plots drawn off-screen."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol


def write_json(out_dir: Path, name: str, settings: dict[str, Any], results: Any) -> Path:
    """`{"settings": …, "results": …}` as `out_dir/name` (the folder is made if missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(json.dumps({"settings": settings, "results": results}, indent=2))
    return path


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def percentile_series(rows: Sequence[dict[str, Any]], key: str, percentile: str) -> list[float]:
    """`row[key][percentile]` of each row, NaN where it is missing (matplotlib leaves a gap)."""
    return [row[key][percentile] if row[key][percentile] is not None else float("nan") for row in rows]


def save_figure(figure: Any, path: Path) -> Path:
    """Lay out `figure`, write it as a PNG to `path`, release it."""
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot().close(figure)
    return path


class Answer(Protocol):
    """A finished answer of a benchmark session (client/turns.py's TurnResult, client/chat.py's ChatTurn)."""

    @property
    def metrics(self) -> dict[str, Any]: ...


class Progress:
    """Called with each answer as it ends: says on stderr how many of the level's `total`
    answers are done and the last one's TTFP, at most once per `interval_s`; always once all are."""

    def __init__(self, prefix: str, total: int, unit: str = "turns", *, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.prefix, self.total, self.unit = prefix, total, unit
        self.interval_s, self.clock = interval_s, clock
        self.done = 0
        self.printed_at: float | None = None

    def __call__(self, answer: Answer) -> None:
        self.done += 1
        now = self.clock()
        if self.done < self.total and self.printed_at is not None and now - self.printed_at < self.interval_s:
            return
        self.printed_at = now
        ttfp = answer.metrics.get("ttfp_ms")
        print(f"{self.prefix}: {self.done}/{self.total} {self.unit} done (TTFP last "
              f"{'-' if ttfp is None else f'{ttfp:.0f} ms'})", file=sys.stderr, flush=True)


def run_levels(name: str, levels: Sequence[int], run_level: Callable[[int, Progress], dict[str, Any]], *,
               answers_per_session: int, unit: str = "turns") -> list[dict[str, Any]]:
    """`run_level(sessions, progress)` for each level in turn, saying on stderr what runs, how
    far it got (`progress`, to call with each answer of its `answers_per_session` per session,
    counted in `unit`) and how it went (a level can take minutes)."""
    rows = []
    for sessions in levels:
        print(f"{name}: {sessions} concurrent session(s)…", file=sys.stderr, flush=True)
        row = run_level(sessions, Progress(f"{name}: {sessions} session(s)", sessions * answers_per_session, unit))
        print(f"{name}: {sessions} session(s): {row['completed_turns']}/{row['turns']} turns completed in "
              f"{row['wall_s']:.1f} s", file=sys.stderr, flush=True)
        rows.append(row)
    return rows
