"""What every benchmark writes: its settings and results as JSON, and plots drawn off-screen."""

from __future__ import annotations

import json
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
