"""Which model family serves a checkpoint, found by its config's `architectures` (or
`model_type`). The CLI, the offline API and the tests build engines through here; a new
family is one entry in `FAMILIES`."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.config import DeployConfig, load_deploy_config
from vllm_omni.engine import OmniEngine
from vllm_omni.engine.family import ModelFamily


@dataclass(frozen=True)
class FamilyEntry:
    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    loader: str  # "module:Class" with a `load(model, deploy, **options)` classmethod


FAMILIES = (
    FamilyEntry("qwen3_omni", ("Qwen3OmniMoeForConditionalGeneration",), ("qwen3_omni_moe",),
                "vllm_omni.models.qwen3_omni.family:Qwen3OmniFamily"),
)


class UnknownModelError(ValueError):
    """No registered family serves the checkpoint."""


def checkpoint_config(model: str | Path) -> dict[str, Any]:
    """The checkpoint's config.json, from a local folder or the local Hugging Face cache."""
    folder = Path(model)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(str(model), local_files_only=True, allow_patterns=["config.json"]))
    return json.loads((folder / "config.json").read_text())


def find_family(config: dict[str, Any]) -> FamilyEntry:
    architectures = set(config.get("architectures") or ())
    for entry in FAMILIES:
        if architectures & set(entry.architectures) or config.get("model_type") in entry.model_types:
            return entry
    known = ", ".join(a for entry in FAMILIES for a in entry.architectures)
    raise UnknownModelError(f"no model family serves architectures {sorted(architectures)} "
                            f"(model_type {config.get('model_type')!r}); known: {known}")


def load_family(model: str | Path, deploy: DeployConfig, **options: Any) -> ModelFamily:
    module, _, name = find_family(checkpoint_config(model)).loader.partition(":")
    return getattr(importlib.import_module(module), name).load(model, deploy, **options)


def load_engine(model: str | Path, deploy_config: str | Path | DeployConfig, **options: Any) -> OmniEngine:
    """An engine serving `model` with the family its checkpoint belongs to."""
    deploy = deploy_config if isinstance(deploy_config, DeployConfig) else load_deploy_config(deploy_config)
    return OmniEngine(load_family(model, deploy, **options))
