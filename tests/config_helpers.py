"""Writing small deploy YAMLs for the config tests."""

from __future__ import annotations

from pathlib import Path

import yaml


def write(folder: Path, name: str, data: dict | str) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def stage(stage_id: int, role: str = "thinker", **fields) -> dict:
    return {"stage_id": stage_id, "role": role, "backend": "torch", **fields}
