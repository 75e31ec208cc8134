"""The deploy configs shipped in the repository's `configs/` folder."""

from __future__ import annotations

from pathlib import Path

BUNDLED_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def bundled_config_names() -> list[str]:
    return sorted(p.stem for p in BUNDLED_CONFIG_DIR.glob("*.yaml"))


def get_deploy_config_path(name: str) -> Path:
    """Path of a bundled deploy config, by file name with or without `.yaml`."""
    path = BUNDLED_CONFIG_DIR / (name if name.endswith(".yaml") else f"{name}.yaml")
    if not path.is_file():
        raise FileNotFoundError(
            f"no bundled deploy config {name!r} in {BUNDLED_CONFIG_DIR}; "
            f"available: {', '.join(bundled_config_names()) or 'none'}")
    return path
