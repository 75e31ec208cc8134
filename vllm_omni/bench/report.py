"""What every benchmark writes: its settings and results as JSON, and plots drawn off-screen."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


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


def run_levels(name: str, levels: Sequence[int], run_level: Callable[[int], dict[str, Any]]) -> list[dict[str, Any]]:
    """`run_level(sessions)` for each level in turn, saying on stderr what runs and how it went
    (a level can take minutes)."""
    rows = []
    for sessions in levels:
        print(f"{name}: {sessions} concurrent session(s)…", file=sys.stderr, flush=True)
        row = run_level(sessions)
        print(f"{name}: {sessions} session(s): {row['completed_turns']}/{row['turns']} turns completed in "
              f"{row['wall_s']:.1f} s", file=sys.stderr, flush=True)
        rows.append(row)
    return rows
